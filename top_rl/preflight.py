"""Every refusal a config or its inputs can cause, checked once at the very start of a run: before Ray,
wandb or any file write. A refused run costs no GPU time and leaves nothing behind, not even run_dir.

Each check is a function `(cfg, ready) -> part` that raises with a message naming the key, file:line
or prompt and the fix; CHECKS runs them in order (cheap config checks first, the dataset scan and the
checkpoint verification last). A check that loads something the run needs (task, model config, resume state) returns
it as its part of `Ready` (a dict of Ready's fields; None: nothing), so the run does not load it twice; `ready` is
what the checks before it returned, read-only, and `check` alone builds the frozen result. A new refusal is one
function and one line in CHECKS.
Reading is all they do: the lock (top_rl.run.lock) is the run's first write, right after.
`dry_run=true` runs CONFIG_CHECKS, those that need only the config (and model.path's config.json where this
machine has it): the planning machine need not hold the data, the weights or the run's resources. A sweep runs
SWEEP_CHECKS (its data included) on every job before its first job starts (top_rl.cli.SweepPrecheck).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from top_rl.driver.shared_run_dir import RunDirNotShared
from top_rl import config_checks, contract, tasks
from top_rl.run import checkpoint
from top_rl.driver import placement
from top_rl.driver.plan import EngineSpec, RunPlan, TrainerSpec
from top_rl.tasks import prompts
from top_rl.run import lock as run_lock
from top_rl.run.checkpoint import ResumeRefused
from top_rl.run.fault_injection import NO_FAULTS, BadFaultSpec, FaultPlan
from top_rl.config import ConfigError, kernel_backend
from top_rl.driver import resolution as run_resolution
from top_rl.model import family, source
from top_rl.driver.placement import PlacementError
from top_rl.model.family import UnsupportedModel
from top_rl.tasks.prompts import BadInput
from top_rl.rollout.sglang.config import TopConfigError
from top_rl.run.lock import RunDirLocked
from top_rl.train import layout_rules
from top_rl.config.trainer import TrainerSettings
from top_rl.train.layout_rules import LayoutError


class Refused(ValueError):
    """A run refused at start; the message says what and how to fix it."""


# What `top-rl` reports as a one-message refusal (exit 1, no traceback).
REFUSALS = (Refused, ConfigError, TopConfigError, BadInput, UnsupportedModel, ResumeRefused, RunDirLocked,
            PlacementError, LayoutError, BadFaultSpec, RunDirNotShared)


@dataclass(frozen=True)
class Ready:
    """What the checks loaded, for the run to use: built by `check` alone, from the parts the checks return in order
    (a check reads only what an earlier one returned: CHECKS' comment says which)."""
    task: Any = None
    model_cfg: Any = None
    max_prompt_len: int = 0
    state: dict | None = None  # the verified checkpoint state to resume from (None: step 0)
    checkpoints_seen: tuple[str, ...] = ()
    shape: layout_rules.ModelShape | None = None  # the model's sizes the trainer layout splits
    sglang: tuple = ()  # rollout=sglang: each engine's checked SglangEngineConfig
    placement: placement.Placement | None = None
    faults: FaultPlan = NO_FAULTS  # test-only: what TOP_RL_FAULT names (top_rl.run.fault_injection)
    backend: Any = None  # what `auto` chose (top_rl.driver.backend_choice.BackendChoice); None: nothing was auto
    # what the machine and the environment decided (top_rl.driver.resolution.Resolution): the first check's
    resolution: run_resolution.Resolution | None = None
    longest_prompt: int = 0  # the longest prompt a rollout can see (prompt_lengths)
    memory: Any = None  # what mem_fraction_static=auto chose (top_rl.driver.memory_choice.MemoryChoice)
    eval_set: Any = None  # eval.every > 0: the eval's prompts and sampling (top_rl.eval.run.EvalSet)

    def state_under_lock(self, cfg) -> dict | None:
        """The resume state, re-read if another run changed the checkpoints between the checks and the lock (the loop
        asks once it holds the run's lock)."""
        if tuple(p.name for p in checkpoint.complete_checkpoints(Path(cfg.run_dir))) != self.checkpoints_seen:
            return resume_state(cfg, self)["state"]
        return self.state


def fault_plan(cfg, ready: Ready) -> dict:
    """Test-only: TOP_RL_FAULT, read here once into the run plan (top_rl.run.fault_injection); a malformed one is
    refused naming the bad part."""
    return {"faults": FaultPlan.from_env()}


def resolution(cfg, ready: Ready) -> dict:
    """The run's one resolution step (top_rl/driver/resolution.py): the installed release's contract, where Ray runs
    (cluster.address or $RAY_ADDRESS), `auto` for top.attention_backend / rollout.logprob_source (fa3 with the decode
    source on Hopper where the contract proves it), a bench's $TOP_RL_<SWITCH> overrides; written into cfg before any
    other check reads it, recorded in the run plan."""
    try:
        resolved = run_resolution.resolve(cfg)
    except run_resolution.Unresolvable as e:
        raise Refused(str(e)) from None
    if not cfg.dry_run:  # a dry run prints them in its plan (stdout is the JSON)
        if resolved.backend is not None:
            print(f"[top-rl] attention backend: {resolved.backend.why}", flush=True)
        for o in resolved.overrides:
            print(f"[top-rl] {o.variable} overrides {o.key}={o.config}: {o.value}", flush=True)
    return {"resolution": resolved, "backend": resolved.backend}


def _on_cluster(cfg, ready: Ready) -> bool:
    """A running Ray cluster (the resolution's; a check run without it: cluster.address)."""
    return ready.resolution.on_cluster if ready.resolution else bool(cfg.cluster.address)


def config_values(cfg, ready: Ready) -> None:
    """Choices, ranges, non-finite numbers, optimizer values, GRPO group size (top_rl.config_checks.validate); then run_dir
    made absolute on the driver, once, for everything after: a relative one would otherwise be read in each process's
    own working directory (a Ray job's is not the submitter's). abspath, not realpath: the path as given is the one
    the other nodes mount."""
    config_checks.validate(cfg)
    cfg.run_dir = os.path.abspath(cfg.run_dir)


def task_config(cfg, ready: Ready) -> None:
    """The task's name and keys (no data is read)."""
    try:
        tasks.task_config(cfg.task.name, cfg.task)
    except (KeyError, ValueError, TypeError) as e:
        raise BadInput(f"task: {e.args[0] if e.args else e}") from None


def _k_chunk(cfg) -> int | None:
    """The contract's GEMM K chunk where the trainer's kernels split K by it (the reference kernels)."""
    return contract.get(cfg.top.contract).tiling.k_chunk if kernel_backend(cfg) == "reference" else None


def trainer_layout(cfg, ready: Ready) -> dict | None:
    """trainer.tp / pp / cp split the model (top_rl.train.layout_rules): model.path's config.json where this machine
    has it (else model_fits_task refuses the path), or the model.* fields; a random model's vocabulary, its
    task tokenizer's, is checked once the task is loaded (model_fits_task)."""
    path = cfg.model.path
    if path and not (Path(path) / "config.json").is_file():
        return
    shape = layout_rules.ModelShape.of(family.config_from_dir(path) if path else cfg.model)
    t = cfg.trainer
    layout_rules.check(shape, t.tp, t.pp, t.cp, _k_chunk(cfg))
    return {"shape": shape}


def sglang_engines(cfg, ready: Ready) -> dict | None:
    """Every SGLang engine's refusals that need no server: port, flags, extra_args, attention backend, env (a run
    without model.path starts its servers from its random initial policy, written at start)."""
    if cfg.rollout.engine != "sglang":
        return
    from top_rl.rollout.sglang.plan import engine_config

    return {"sglang": tuple(engine_config(cfg, index=i) for i in range(cfg.rollout.num_engines))}


def resources(cfg, ready: Ready) -> dict:
    """The placement (engines, trainer ranks, their GPUs and CPUs) fits this machine (local runs; a running
    cluster is checked once connected, top_rl.driver.cluster). Reads trainer_layout's shape."""
    hint = layout_rules.hint(ready.shape, _k_chunk(cfg)) if ready.shape else ""
    return {"placement": placement.check_before_start(cfg.rollout.num_engines, cfg.trainer, cfg.cluster, hint,
                                                      on_cluster=_on_cluster(cfg, ready))}


def run_dir_writable(cfg, ready: Ready) -> None:
    run_dir = Path(cfg.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise Refused(f"run_dir={run_dir} is a file, not a directory: pick another run_dir=")
    probe = run_dir
    while not probe.exists():  # the directory the run would create run_dir in
        probe = probe.parent
    if not probe.is_dir():  # mkdir would fail under it (NotADirectoryError), after the checks passed
        raise Refused(f"run_dir={run_dir} cannot be created: {probe} is a file, not a directory; pick another run_dir=")
    kw = {"effective_ids": True} if os.access in os.supports_effective_ids else {}
    targets = [probe] + [run_dir / n for n in ("checkpoints", "wandb", "metrics.jsonl") if (run_dir / n).exists()]
    for target in targets:
        if not os.access(target, os.W_OK | (os.X_OK if target.is_dir() else 0), **kw):
            raise Refused(f"run_dir={run_dir} is not writable ({target} refuses writes): the run could not save its "
                          "metrics or checkpoints. Fix the permissions, or pick a writable run_dir=")


def run_dir_entries(cfg, ready: Ready) -> None:
    """What the run itself writes in run_dir is not already there as a link: run.lock (written through, it would
    change a file outside the run: top_rl.run.lock) and checkpoints/step_N.tmp or .old (a checkpoint write removes
    and recreates them: a link there failed the run after its step trained)."""
    refusal = run_lock.refusal(cfg.run_dir)
    if refusal:
        raise Refused(refusal)
    refusal = checkpoint.scratch_refusal(Path(cfg.run_dir))
    if refusal:
        raise Refused(refusal)


def task_data(cfg, ready: Ready) -> dict:
    """The dataset loads (bad rows named file:line) and is not empty."""
    task = prompts.load_task(cfg.task)
    if len(task) == 0:
        where = getattr(cfg.task, "path", None) or "its data"
        skipped = getattr(task, "skipped", 0)
        raise BadInput(f"task {task.name!r}: {where} holds no usable rows"
                       + (f" ({skipped} bad rows skipped under task.on_bad_row=skip)" if skipped else "")
                       + ": nothing to train on")
    return {"task": task}


def model_fits_task(cfg, ready: Ready) -> dict:
    """The model is one a TOP contract covers (model.path's config.json, its weight files present), the task's
    tokenizer fits it and the trainer layout splits its vocabulary. Reads task_data's task."""
    task = ready.task
    model_cfg = source.arch_config(cfg.model, task.vocab_size, task.eos_token_id)
    prompts.check_tokenizer(task, model_cfg)
    if cfg.model.path:
        from top_rl.model.hf_io import weight_files

        weight_files(cfg.model.path)
    t = cfg.trainer
    layout_rules.check(layout_rules.ModelShape.of(model_cfg), t.tp, t.pp, t.cp, _k_chunk(cfg))
    return {"model_cfg": model_cfg, "max_prompt_len": model_cfg.max_position_embeddings - cfg.rollout.max_new_tokens}


def _arch_before_the_task(cfg):
    """The model's config without the task: model.path's config.json (None where this machine lacks it), or the
    random model's shape with a one-token vocabulary (its tokenizer's size is not known yet: a lower bound)."""
    path = cfg.model.path
    if path:
        return family.config_from_dir(path) if (Path(path) / "config.json").is_file() else None
    return source.arch_config(cfg.model, 1, None)


def host_memory(cfg, ready: Ready) -> None:
    """The step's batch and, on a local run, the models of the actors computing on the CPU and the native CPU engines'
    generate calls fit this host's memory (lower bounds: top_rl/driver/host_memory.py). Reads model_fits_task's
    model_cfg where it ran (a dry run's checks do not load the task)."""
    from top_rl.driver import host_memory as host

    r, c = cfg.rollout, cfg.cluster
    models = calls = None
    if not _on_cluster(cfg, ready):  # a local run: every actor is on this host
        arch = ready.model_cfg or _arch_before_the_task(cfg)
        engines = r.num_engines if r.engine != "sglang" and not c.engine_gpus else 0
        replicas = cfg.trainer.dp * cfg.trainer.cp if not c.trainer_gpus else 0
        if arch is not None:
            models = host.cpu_models(arch, cfg.model.dtype, engines, replicas)
            # the batch bound alone let a step start whose one native call could not hold its rows' KV cache
            # (26.7 M samples: the engine failed to allocate 41 GB, after Ray started); the KV cache alone let
            # rollout.n_samples=100000 start on a 23.5 GiB host (1.6 M rows x 1.5 KB), whose call needs ~74 KB a
            # row on the reference kernels: the bound counts the call's largest working set too
            top = contract.CONTRACTS.get(cfg.top.contract)
            calls = host.cpu_engine_calls(arch, cfg.model.dtype, engines, r.prompts_per_step * r.n_samples,
                                          c.rollout_chunk, r.max_new_tokens, kernel_backend(cfg) == "reference",
                                          top.tiling if top else None) if engines else None
    refusal = host.refusal(r.prompts_per_step, r.n_samples, r.max_new_tokens, models, host.host_bytes(), calls)
    if refusal:
        raise Refused(refusal)


def shared_gpu_memory(cfg, ready: Ready) -> dict | None:
    """`rollout.sglang.mem_fraction_static=auto` decided (top_rl/driver/memory_choice.py: sized from the GPU, the model,
    the batch's KV need and the trainer beside it; offload turned on where that lets the batch run), then SGLang
    servers sharing a trainer rank's GPU (cluster.colocate=true) leave it room: their static pool, their per-batch
    memory and the trainer rank fit the GPU (top_rl/rollout/sglang/memory.py). Local runs only (a running cluster's
    GPUs are not visible here). Reads model_fits_task's model_cfg and prompt_lengths' longest_prompt; its part is the
    choice and the engines' configs with its number (sglang_engines' part, replaced)."""
    if cfg.rollout.engine != "sglang":
        return None
    from top_rl.driver import memory_choice
    from top_rl.rollout.sglang import memory as sglang_memory

    try:
        memory = memory_choice.resolve(cfg, ready.model_cfg, ready.longest_prompt or ready.max_prompt_len,
                                       on_cluster=_on_cluster(cfg, ready))
    except ValueError as e:
        raise Refused(str(e)) from None
    part = None
    if memory is not None:  # the engines' configs take the number (and the plan records it)
        part = {"memory": memory, "sglang": tuple(dataclasses.replace(s, mem_fraction_static=memory.mem_fraction_static)
                                                  for s in ready.sglang)}
        print(f"[top-rl] rollout.sglang.mem_fraction_static=auto: {memory.why}", flush=True)
    if not cfg.cluster.colocate or _on_cluster(cfg, ready):
        return part
    seen = memory_choice.local_gpu()  # GPU 0 as the driver sees it (NVML), the GPU auto was sized for
    if seen is None:
        return part
    gpu = seen.total_bytes
    t = cfg.trainer
    world = t.world
    servers = -(-cfg.rollout.num_engines // world)
    fraction = cfg.rollout.sglang.mem_fraction_static or 0.88  # None: SGLang's own (~0.88 on H200)
    tokens = t.micro_batch_tokens or (t.micro_batch_size or 1) * ready.model_cfg.max_position_embeddings
    est = sglang_memory.estimate(ready.model_cfg, tokens, t.recompute, fraction, servers, gpu,
                                 handoff=cfg.cluster.gpu_handoff, offload=t.offload_during_rollout)
    if est.needed > gpu:
        best = est.best_fraction()
        fix = (f"set rollout.sglang.mem_fraction_static <= {best:.2f} (or auto)" if best > 0.05 else
               "the trainer alone leaves no room for a server")
        raise Refused(f"the GPU shared by the trainer and SGLang (cluster.colocate=true) cannot hold both: "
                      f"{est.describe()}. {fix}, or lower trainer.micro_batch_tokens, or give the engines their own "
                      f"GPUs (cluster.colocate=false)")
    return part


def prompt_lengths(cfg, ready: Ready) -> dict:
    """Under rollout.on_long_prompt=error no prompt may be too long; under skip at least one must fit. Reads
    task_data's task and model_fits_task's max_prompt_len; its part is the longest prompt a rollout can see (what
    sizes rollout.sglang.mem_fraction_static=auto)."""
    return {"longest_prompt": prompts.check_lengths(ready.task, ready.max_prompt_len, cfg.rollout.on_long_prompt)}


def eval_data(cfg, ready: Ready) -> dict | None:
    """eval.every > 0: the eval set loads (eval.path / eval.split) and holds a prompt that fits, before anything
    starts (top_rl.eval.run.build). Reads task_data's task and model_fits_task's model_cfg."""
    if cfg.eval.every > 0:
        from top_rl.eval import run as eval_run

        return {"eval_set": eval_run.build(cfg, ready.task, ready.model_cfg.max_position_embeddings)}
    return None


def resume_state(cfg, ready: Ready) -> dict:
    """A fresh run never overwrites checkpoints; a resume takes the newest checkpoint that verifies and
    refuses changed determinism-relevant settings (top_rl.run.checkpoint.prepare)."""
    seen = tuple(p.name for p in checkpoint.complete_checkpoints(Path(cfg.run_dir)))
    try:
        return {"checkpoints_seen": seen, "state": checkpoint.prepare(Path(cfg.run_dir), cfg)}
    except ResumeRefused:  # judged on a run_dir a live run is writing: that run is the story (RunLock says it)
        run_lock.refuse_if_held(cfg.run_dir)
        raise


# The order is the only link between checks: resolution writes the contract, `auto`'s choice and the overrides into
# cfg before any later check reads them (and says whether Ray runs on a cluster); config_values makes run_dir absolute
# for the rest; resources reads trainer_layout's shape; model_fits_task reads task_data's task; host_memory,
# prompt_lengths, shared_gpu_memory and eval_data read model_fits_task's part; shared_gpu_memory reads prompt_lengths'
# longest prompt and replaces sglang_engines' engine configs.
CONFIG_CHECKS = (fault_plan, resolution, config_values, task_config, sglang_engines, trainer_layout)
CHECKS = CONFIG_CHECKS + (resources, run_dir_writable, run_dir_entries, task_data, model_fits_task, host_memory,
                          prompt_lengths, shared_gpu_memory, eval_data, resume_state)
# What a sweep checks for every job before its first job starts (top_rl.cli): the config's refusals, run_dir's, the
# job's data and model (task.path=good.jsonl,/dev/zero trained job 0, then refused job 1, leaving both behind), its
# eval data, and memory; not the checkpoints' (a resumed sweep's jobs verify theirs when each starts).
SWEEP_CHECKS = CONFIG_CHECKS + (run_dir_writable, run_dir_entries, task_data, model_fits_task, host_memory,
                                prompt_lengths, eval_data)


def check(cfg, checks=CHECKS) -> Ready:
    """Run `checks` in order; the one place a Ready is built: each check's part over what came before."""
    ready = Ready()
    for run_check in checks:
        part = run_check(cfg, ready)
        if part:
            ready = dataclasses.replace(ready, **part)
    return ready


def run_plan(cfg, ready: Ready) -> RunPlan:
    """What the driver places and starts (top_rl.driver.plan), from the config and what the checks loaded."""
    from top_rl.rl.batch import RLStepConfig
    from top_rl.rollout.sglang.plan import initial_policy_dir

    from top_rl.observe.startup import run_logs_dir

    run_dir = Path(cfg.run_dir)
    logs = run_logs_dir(run_dir)
    # each server's output goes to this run's log directory unless rollout.sglang.log_path names a file
    sglang = tuple(dataclasses.replace(s, log_path=str(logs / f"sglang-{i}-port{s.port}.log")) if not s.log_path
                   else s for i, s in enumerate(ready.sglang)) if ready.sglang else (None,) * cfg.rollout.num_engines
    # lr_decay_steps null: the schedule decays over the run's every optimizer update
    decay = cfg.trainer.lr_decay_steps or cfg.steps * cfg.algo.updates_per_rollout
    trainer = TrainerSpec(world=cfg.trainer.world, trainer_cfg=TrainerSettings.of(cfg.trainer, dtype=cfg.model.dtype,
                                                                                  lr_decay_steps=decay),
                          step_cfg=RLStepConfig(loss=cfg.algo.loss, gate=cfg.top,
                                                dump_dir=str((run_dir / "parity").resolve()),
                                                old_logprobs=str(cfg.algo.old_logprobs),
                                                policy_lag=cfg.rollout.policy_lag),
                          model_cfg=cfg.model, arch=ready.model_cfg, vocab_size=ready.task.vocab_size,
                          eos_token_id=ready.task.eos_token_id, release_cache_after_step=cfg.cluster.gpu_handoff,
                          faults=ready.faults)
    return RunPlan(
        cluster=cfg.cluster, placement=ready.placement,
        # from the resolved config (its TOP_RL_* overrides applied and recorded); why its attention kernel is the one it is
        kernels=run_resolution.kernel_plan(cfg, ready.resolution), resolution=ready.resolution,
        engines=tuple(EngineSpec(cfg.rollout.engine, cfg.rollout.logprob_source, cfg.model.dtype, ready.model_cfg, sglang=s)
                      for s in sglang),
        trainer=trainer, faults=ready.faults, logs_dir=str(logs), run_dir=cfg.run_dir,
        initial_policy=str(initial_policy_dir(run_dir)) if cfg.rollout.engine == "sglang" and not cfg.model.path
        else None)
