"""The run config's value checks: every refusal a config alone decides (choices, ranges, what cannot run together),
each naming the key and what it accepts. Run once, by the run's preflight (top_rl.preflight.config_values), on the
resolved config (top_rl.driver.resolution: `auto` and the contract decided)."""

from __future__ import annotations

import math

from top_rl import contract
from top_rl.config import ConfigError, RunConfig, kernel_backend, plain
from top_rl.config.kernels import AttentionBackend
from top_rl.eval import config as eval_config
from top_rl.kernels import KernelBackend
from top_rl.rl import dynamic_sampling, lr_schedule, overlong
from top_rl.weights import transport as weight_transport


# Choices an enum cannot state: the enum-typed fields are checked by OmegaConf when the config composes.
_CHOICES = {
    "top.kernels": tuple(k.value for k in KernelBackend if k not in (KernelBackend.plain, KernelBackend.stock)),
}
_POSITIVE = ("steps", "rollout.prompts_per_step", "rollout.n_samples", "rollout.max_new_tokens", "rollout.save_samples_rows",
             "rollout.num_engines", "trainer.dp", "trainer.tp", "trainer.pp", "trainer.cp", "checkpoint.keep",
             "algo.updates_per_rollout")


def _get(cfg, dotted):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _non_finite(tree, key=""):
    """(dotted key, value) of every NaN / inf number in the config (a NaN temperature would reach the sampler)."""
    if isinstance(tree, float) and not math.isfinite(tree):
        yield key, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from _non_finite(v, f"{key}.{k}" if key else str(k))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _non_finite(v, f"{key}[{i}]")


def _optimizer_errors(t) -> list[str]:
    errors = []
    if not t.lr > 0:
        errors.append(f"trainer.lr={t.lr} must be > 0 (0 never learns; a negative lr climbs the loss)")
    if not t.eps > 0:
        errors.append(f"trainer.eps={t.eps} must be > 0 (Adam divides by sqrt(v) + eps)")
    if len(t.betas) != 2 or not all(0 <= b < 1 for b in t.betas):
        errors.append(f"trainer.betas={list(t.betas)} must be two numbers in [0, 1)")
    for key in ("weight_decay", "grad_clip"):
        if not getattr(t, key) >= 0:
            errors.append(f"trainer.{key}={getattr(t, key)} must be >= 0" + (" (0 disables clipping)"
                                                                           if key == "grad_clip" else ""))
    return errors


def validate(cfg: RunConfig) -> RunConfig:
    errors = [f"{key}={v} must be a finite number" for key, v in _non_finite(cfg.as_dict())]
    if errors:  # the checks below would only repeat them
        raise ConfigError("invalid config: " + "; ".join(errors))
    if not cfg.run_dir.strip():  # `run_dir=$UNSET`: Path("") is the working directory, which the run would fill
        errors.append(f"run_dir={cfg.run_dir!r} is empty (an unset shell variable?): the run would write into the "
                      "current directory; give it one, e.g. run_dir=runs/NAME")
    errors += _model_errors(cfg.model)
    chosen = contract.CONTRACTS.get(cfg.top.contract)  # None: refused just below, by name
    choices = {**_CHOICES, "top.contract": tuple(contract.CONTRACTS)}  # the registry as it is now
    if chosen is not None:  # the backends the run's contract allows (another contract may allow others), or auto
        # (decided on the driver before the run's checks, which then see the backend it chose: preflight)
        choices["top.attention_backend"] = (*chosen.attention_backends, AttentionBackend.auto.value)
    for key, allowed in choices.items():
        if _get(cfg, key) not in allowed:
            errors.append(f"{key}={plain(_get(cfg, key))!r} is not allowed; choose one of: {', '.join(allowed)}")
    for key in _POSITIVE:
        if _get(cfg, key) < 1:
            errors.append(f"{key}={_get(cfg, key)} must be >= 1")
    for key in ("trainer.micro_batch_size", "trainer.micro_batch_tokens"):  # null: no limit of that kind
        if _get(cfg, key) is not None and _get(cfg, key) < 1:
            errors.append(f"{key}={_get(cfg, key)} must be >= 1, or null (a negative size plans no micro-batch at all)")
    for key in ("checkpoint.every", "cluster.max_engine_restarts", "rollout.save_samples_every"):
        if _get(cfg, key) < 0:
            errors.append(f"{key}={_get(cfg, key)} must be >= 0")
    if not cfg.cluster.stop_grace_s >= 0:
        errors.append(f"cluster.stop_grace_s={cfg.cluster.stop_grace_s} must be >= 0 (0: a stop signal abandons the "
                      "step in progress at once)")
    if cfg.cluster.torch_threads < 0:  # torch.set_num_threads refuses it in every actor, after Ray started
        errors.append(f"cluster.torch_threads={cfg.cluster.torch_threads} must be >= 1, or 0 (the machine's cores)")
    # Every process seeds python, numpy and torch with these (top_rl.run.rng.seed): numpy takes 0 .. 2**32 - 1 only,
    # and refused -1 or 2**70 in each trainer actor, after Ray started (the driver's seed: in the driver, the same).
    for key in ("seed", "trainer.seed"):
        if not 0 <= _get(cfg, key) < 2 ** 32:
            errors.append(f"{key}={_get(cfg, key)} must be between 0 and {2 ** 32 - 1} (numpy's seed range; every "
                          "process seeds python, numpy and torch with it)")
    if contract.temperature_refusal(cfg.rollout.temperature):
        errors.append(f"rollout.temperature={cfg.rollout.temperature} {contract.temperature_refusal(cfg.rollout.temperature)}")
    errors += _optimizer_errors(cfg.trainer)
    t = cfg.trainer
    errors += lr_schedule.errors(t.lr_schedule, t.lr_warmup_steps, t.lr, t.lr_min, t.lr_decay_steps)
    if cfg.rollout.n_samples < 2:
        errors.append(f"rollout.n_samples={cfg.rollout.n_samples} must be >= 2 for GRPO: advantages are relative "
                      "to the prompt's group, so a group of one has advantage 0 and gives no gradient")
    if cfg.cluster.gpu_handoff and cfg.rollout.engine != "sglang":
        errors.append(f"cluster.gpu_handoff=true hands a GPU between SGLang servers and the trainer rank they share it "
                      f"with (SGLang's release/resume_memory_occupation): it needs rollout.engine=sglang, not "
                      f"{cfg.rollout.engine}")
    if cfg.trainer.offload_during_rollout and not cfg.cluster.gpu_handoff:
        errors.append("trainer.offload_during_rollout=true parks the trainer's optimizer state in host memory while a "
                      "server it shares the GPU with generates, which only cluster.gpu_handoff=true does; set "
                      "cluster.gpu_handoff=true (with cluster.colocate=true) or trainer.offload_during_rollout=false")
    errors += _policy_lag_errors(cfg)
    transport_refusal = weight_transport.refusal(cfg.cluster.weight_transport, cfg.rollout.engine)
    if transport_refusal:
        errors.append(transport_refusal)
    batch = cfg.rollout.prompts_per_step * cfg.rollout.n_samples
    if cfg.algo.updates_per_rollout > batch:
        errors.append(f"algo.updates_per_rollout={cfg.algo.updates_per_rollout} exceeds the {batch} samples of a step "
                      "(rollout.prompts_per_step x rollout.n_samples): each update needs at least one")
    refusal = chosen and cfg.top.attention_backend != "auto" and chosen.decode_refusal(cfg.top.attention_backend)
    if cfg.top.enabled and kernel_backend(cfg) == "sglang" and cfg.rollout.logprob_source == "decode" and refusal:
        proven = ", ".join(chosen.decode_equals_extend)
        errors.append(f"rollout.logprob_source=decode with top.kernels=sglang and top.attention_backend="
                      f"{cfg.top.attention_backend}: {refusal}; use rollout.logprob_source=prefill"
                      + (f" or an attention backend proven equal ({proven})" if proven else ""))
    if cfg.top.enabled and chosen is not None and chosen.gemm == "deepgemm" and kernel_backend(cfg) != "sglang":
        errors.append(f"top.contract={cfg.top.contract} names DeepGEMM, which only top.kernels=sglang runs (the "
                      f"{kernel_backend(cfg)} kernels compute their own GEMM); set top.kernels=sglang (a Hopper GPU "
                      f"with deep_gemm) or top.contract={' | '.join(contract.with_gemm(chosen, 'triton_persistent'))}")
    if cfg.trainer.megatron_rope and kernel_backend(cfg) == "sglang":
        errors.append("trainer.megatron_rope=true with top.kernels=sglang: Megatron's eager RoPE is not bitwise the "
                      "engine's (SGLang's rl mode compiles its RoPE, which the sglang kernels reproduce; "
                      "top_rl/train/qwen3_megatron.py); set trainer.megatron_rope=false")
    ds, ol = cfg.algo.dynamic_sampling, cfg.algo.overlong
    if ds.enabled:
        errors += dynamic_sampling.errors(ds.max_rounds, batch)
    if ol.enabled:
        errors += overlong.errors(ol.buffer, ol.penalty_factor, cfg.rollout.max_new_tokens)
    # every round's seeds (dynamic sampling's extra rounds index past the step's first batch)
    errors += _seed_errors(cfg, batch * (ds.max_rounds + 1) if ds.enabled and ds.max_rounds >= 0 else batch)
    errors += eval_config.errors(cfg)
    errors += cfg.task.errors()  # the task's string choices and ranges (top_rl.tasks.base.TaskConfig)
    if errors:
        raise ConfigError("invalid config: " + "; ".join(errors))
    return cfg


def _policy_lag_errors(cfg: RunConfig) -> list[str]:
    """rollout.policy_lag: 0, 1 or 2, one schedule each (top_rl.driver.schedule: one rollout in flight, the push of
    the next version waits for it), and what a lag cannot run with."""
    lag = cfg.rollout.policy_lag
    if lag not in (0, 1, 2):
        return [f"rollout.policy_lag={lag} must be 0 (synchronous), 1 (the next rollout generates while this step "
                "trains) or 2 (the rollout two steps ahead generates while this step trains)"]
    errors = []
    if lag and cfg.cluster.gpu_handoff:
        errors.append(f"rollout.policy_lag={lag} with cluster.gpu_handoff=true: the server must stay resident to "
                      "generate the next batch while the trainer trains, and the handoff gives its GPU memory to the "
                      "trainer for the step; set cluster.gpu_handoff=false or rollout.policy_lag=0")
    if lag and cfg.algo.old_logprobs == "recompute":
        errors.append(f"rollout.policy_lag={lag} with algo.old_logprobs=recompute: under a lag PPO's old policy is the "
                      "behaviour policy's log-probs, computed and proven by the gate's forward under its weights; "
                      "recompute would take the current weights' instead; set algo.old_logprobs=rollout")
    if lag == 2 and cfg.algo.dynamic_sampling.enabled:
        errors.append("rollout.policy_lag=2 with algo.dynamic_sampling.enabled=true: a step's extra rounds must be "
                      "generated under its batch's version, and the engines hold the next batch's by then; set "
                      "algo.dynamic_sampling.enabled=false or rollout.policy_lag=1")
    return errors


def _model_errors(model) -> list[str]:
    """A random model's sizes (model.*) are its family's shape (an unknown family is refused where it is built)."""
    from top_rl.model import family as families

    errors = [] if model.init_std >= 0 else [f"model.init_std={model.init_std} must be >= 0 (the random init's "
                                              "standard deviation)"]
    if model.family in families.FAMILIES:
        errors += families.get(model.family).shape_errors(model, prefix="model.")
    return errors


def _seed_errors(cfg: RunConfig, batch: int) -> list[str]:
    """Every sampling seed of the run (engine.interface.sample_seed over its steps and samples) must fit SGLang's int64
    sampling_seed: the native engine and a server both refuse one that does not, mid-run."""
    from top_rl.engine.interface import sample_seed

    ends = (sample_seed(cfg.seed, 0, 0), sample_seed(cfg.seed, max(cfg.steps, 1) - 1, batch - 1))
    if all(-(2**63) <= s < 2**63 for s in ends):
        return []
    limit = ((2**63 - batch) // 65_537 - max(cfg.steps, 1)) // 1_000_003
    return [f"seed={cfg.seed}: this run's sampling seeds (seed, step, sample) reach {max(ends, key=abs)}, outside "
            f"int64 (SGLang's sampling_seed); use a seed with |seed| < {limit}"]
