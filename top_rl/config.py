"""The run's typed config: one dataclass per component (owned by that component), composed here and
registered with Hydra as the schema of top_rl/conf/config.yaml. Unknown keys fail at compose time; values are
checked by `validate` before any work starts, each error naming the key and what it accepts."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import Enum
from omegaconf import OmegaConf

from top_rl import contract
from top_rl.contract import AttentionBackend, ComputeDtype
from top_rl.kernels import KernelBackend
from top_rl.kernels import plan as kernel_plans
from top_rl.kernels.plan import FastPaths, KernelPlan
from top_rl.run.checkpoint import CheckpointConfig
from top_rl.driver.placement import ClusterConfig
from top_rl.eval import config as eval_config
from top_rl.model.source import ModelConfig
from top_rl.rl import dynamic_sampling, lr_schedule, overlong
from top_rl.rl.config import AlgoConfig, GateConfig, PolicyLossConfig
from top_rl.rollout.config import LogprobSource, RolloutConfig
from top_rl.observe.tracking import TrackingConfig
from top_rl.tasks import TaskConfig
from top_rl.train import TrainerConfig
from top_rl.weights import transport as weight_transport


@dataclass
class TopConfig(GateConfig):
    """TOP's switch and gate (GateConfig: enabled, on_violation; the trainer's gate reads this object itself), and
    what both sides run: the contract, its kernels and the attention backend. enabled=false is the non-TOP
    baseline (the `stock` kernels both sides, parity logged, no gate)."""

    # A name in top_rl.contract.CONTRACTS: the run's contract, decided here once and passed to everything below as an
    # argument (the KernelPlan carries it to the actors).
    contract: str = contract.fallback().name
    kernels: KernelBackend = KernelBackend.reference  # reference (CPU/any device) | sglang (GPU); stock is the baseline's
    # = the SGLang engines' --attention-backend. auto: decided on the driver from its GPU (top_rl/driver/backend_choice.py):
    # fa3 on Hopper where the contract proves fa3's decode equal to its extend, else triton
    attention_backend: AttentionBackend = AttentionBackend.triton
    fast_paths: FastPaths = field(default_factory=FastPaths)  # speed switches (plan.py: 3 change the gradients)


# RunConfig() is the run `top-rl` makes without overrides: its defaults are top_rl/conf/config.yaml's, composed
# (tests/entry/test_config.py checks they agree). A component's own dataclass keeps its library defaults.
@dataclass
class RunConfig:
    # everything the run writes: metrics.jsonl, kernels.json, checkpoints/, wandb/, parity/
    run_dir: str = "runs/default"
    steps: int = 70  # RL steps (rollout, gate, update, weight push) the run makes
    seed: int = 0  # the driver's seed: the prompt order and every sampling seed (seed, step, sample)
    resume: bool = False  # continue run_dir from its newest checkpoint that verifies (refused when there is none)
    resume_allow_changes: bool = False  # resume even if determinism-relevant settings changed
    dry_run: bool = False  # print the launch plan as JSON (engines, trainer layout, contract) and exit
    model: ModelConfig = field(default_factory=lambda: ModelConfig(  # conf/model/tiny.yaml
        dtype=ComputeDtype.float32, max_position_embeddings=64, rope_theta=10000.0))
    # The task group's config (a TaskConfig subclass: top_rl.tasks.TASKS); Hydra's task group picks which.
    task: TaskConfig = field(default_factory=lambda: TaskConfig(name="arith"))
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(  # conf/rollout/native.yaml
        n_samples=16, max_new_tokens=2, logprob_source=LogprobSource.decode))
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(micro_batch_size=64, lr=0.002))  # cpu.yaml
    algo: AlgoConfig = field(default_factory=lambda: AlgoConfig(loss=PolicyLossConfig(clip_eps_high=0.28)))  # grpo
    top: TopConfig = field(default_factory=TopConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    eval: eval_config.EvalConfig = field(default_factory=eval_config.EvalConfig)  # eval.every: an eval every K steps

    def as_dict(self) -> dict:
        return _plain(dataclasses.asdict(self))


def kernel_backend(cfg: RunConfig) -> str:
    """The kernel backend every actor runs: the contract's kernels under TOP, the `stock` kernels for the baseline
    (fast stock kernels on CUDA, plain torch's ops elsewhere: top_rl/kernels/stock.py)."""
    return (cfg.top.kernels if cfg.top.enabled else KernelBackend.stock).value


def resolve_kernel_plan(cfg: RunConfig, attention_chosen_by: str | None = None) -> KernelPlan:
    """The run's KernelPlan, built once on the driver from top.* (a $TOP_RL_<SWITCH> of a bench overrides its fast
    path), and written back into cfg.top.fast_paths, so the resolved config (state.json, wandb) records what every
    actor runs. `attention_chosen_by`: why `auto` chose the attention kernel (top_rl.driver.backend_choice)."""
    try:
        plan = kernel_plans.build(kernel_backend(cfg), cfg.top.contract, cfg.top.attention_backend.value,
                                  cfg.top.fast_paths, attention_chosen_by=attention_chosen_by)
    except ValueError as e:  # a bad $TOP_RL_<SWITCH>
        raise ConfigError(f"invalid config: {e}") from None
    cfg.top.fast_paths = dataclasses.replace(plan.fast_paths)  # a copy: the plan's stays its own
    return plan


def _plain(v):
    if isinstance(v, Enum):
        return v.value
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


class ConfigError(ValueError):
    exit_code = 2  # `top-rl` exits 2 on a config it cannot use, as Hydra does on one it cannot compose


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
            errors.append(f"{key}={_plain(_get(cfg, key))!r} is not allowed; choose one of: {', '.join(allowed)}")
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
    if cfg.algo.name == "grpo" and cfg.rollout.n_samples < 2:
        errors.append(f"rollout.n_samples={cfg.rollout.n_samples} must be >= 2 for GRPO: advantages are relative "
                      "to the prompt's group, so a group of one has advantage 0 and gives no gradient")
    if cfg.trainer.dtype is not None:
        errors.append(f"trainer.dtype={cfg.trainer.dtype}: the trainer computes in model.dtype (engine and trainer "
                      "share one compute dtype under the TOP contract); set model.dtype instead")
    if cfg.algo.loss.kl_coef != 0:
        errors.append(f"algo.loss.kl_coef={cfg.algo.loss.kl_coef}: the loop keeps no reference policy, so a KL penalty "
                      "cannot be computed; set algo.loss.kl_coef=0 (GRPO/DAPO-style runs train without it)")
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


def _dropped_keys(node, obj, prefix: str = ""):
    """Keys of the composed config that its typed result has no field for. `+key=value` adds a key Hydra's
    schema does not have (its own error for `key=value` suggests the `+`), and OmegaConf.to_object drops it
    silently: such a key would change nothing."""
    from omegaconf import DictConfig

    for key in node.keys():
        child = node._get_node(key)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            if key not in {f.name for f in dataclasses.fields(obj)}:
                yield f"{prefix}{key}"
            elif isinstance(child, DictConfig):
                yield from _dropped_keys(child, getattr(obj, key), f"{prefix}{key}.")


def _seed_errors(cfg: RunConfig, batch: int) -> list[str]:
    """Every sampling seed of the run (rollout.base.sample_seed over its steps and samples) must fit SGLang's int64
    sampling_seed: the native engine and a server both refuse one that does not, mid-run."""
    from top_rl.rollout.base import sample_seed

    ends = (sample_seed(cfg.seed, 0, 0), sample_seed(cfg.seed, max(cfg.steps, 1) - 1, batch - 1))
    if all(-(2**63) <= s < 2**63 for s in ends):
        return []
    limit = ((2**63 - batch) // 65_537 - max(cfg.steps, 1)) // 1_000_003
    return [f"seed={cfg.seed}: this run's sampling seeds (seed, step, sample) reach {max(ends, key=abs)}, outside "
            f"int64 (SGLang's sampling_seed); use a seed with |seed| < {limit}"]


def from_hydra(dict_cfg) -> RunConfig:
    """DictConfig composed by Hydra (schema: RunConfig) -> RunConfig, every key typed. Its values are checked once,
    by the run's preflight (top_rl.preflight.config_values calls `validate`), so a config changed after composing is
    checked too."""
    obj = OmegaConf.to_object(dict_cfg)
    dropped = list(_dropped_keys(dict_cfg, obj))
    if dropped:
        raise ConfigError(f"invalid config: {', '.join(dropped)} {'is not a key' if len(dropped) == 1 else 'are not keys'}"
                          " of the config (`top-rl --help` lists them): remove or correct it")
    return obj
