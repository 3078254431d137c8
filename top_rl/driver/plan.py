"""The run plan: everything the driver places and starts, decided once by preflight (top_rl.preflight.run_plan)
from the run config and what the checks loaded, frozen, and handed whole to `Cluster(plan)`. No actor re-reads the
run config: an engine gets its EngineSpec, a trainer rank the TrainerSpec. The test-only fault plan (TOP_RL_FAULT, read
once by preflight: top_rl.run.fault_injection) travels the same way: `RunPlan.faults` for the driver's code,
`TrainerSpec.faults` for the trainer ranks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from top_rl.driver.placement import ClusterConfig, Placement
from top_rl.kernels.plan import KernelPlan
from top_rl.rollout.sglang.config import SglangEngineConfig
from top_rl.run.fault_injection import NO_FAULTS, FaultPlan


@dataclass(frozen=True)
class EngineSpec:
    """One rollout engine."""

    kind: str  # native | sglang
    logprob_source: str  # prefill | decode: the engine number the gate compares
    dtype: str  # the compute dtype (model.dtype)
    arch: Any  # the model family's architecture config (a native engine builds its model from it)
    sglang: SglangEngineConfig | None = None  # kind sglang: this engine's server, checked (port = base + index)


@dataclass(frozen=True)
class TrainerSpec:
    """The trainer group: every rank builds the same model from these."""

    world: int  # dp * tp * pp * cp ranks
    trainer_cfg: Any  # top_rl.train.TrainerSettings: trainer.*, its dtype the model's (one compute dtype both sides)
    step_cfg: Any  # top_rl.rl.batch.RLStepConfig: loss, gate, dump dir
    model_cfg: Any  # top_rl.config.model.ModelConfig: model.path, or the random init's seed and sizes
    arch: Any  # the model family's architecture config (top_rl.model.family)
    vocab_size: int  # the task tokenizer's (a random model's vocabulary)
    eos_token_id: int | None
    # cluster.gpu_handoff: after each step and after each weight push every rank gives its cached GPU memory back
    # (torch.cuda.empty_cache), so a server resuming on its GPU finds it free
    release_cache_after_step: bool = False
    faults: FaultPlan = NO_FAULTS  # test-only: the faults a rank causes (enospc_in_trainer_checkpoint)


@dataclass(frozen=True)
class RunPlan:
    cluster: ClusterConfig
    placement: Placement  # bundles and which actor sits in which (top_rl.driver.placement)
    kernels: KernelPlan  # what every actor process computes under (installed before its first kernel)
    engines: tuple[EngineSpec, ...]
    trainer: TrainerSpec
    # rollout=sglang without model.path: where trainer rank 0 writes the random initial policy the servers start
    # from (their configs' model_path); None otherwise.
    initial_policy: str | None = None
    # this run's log directory, absolute (top_rl.observe.startup.run_logs_dir): actor logs and SGLang server logs
    logs_dir: str | None = None
    # run_dir, absolute on the driver: every node with a trainer rank must see it (top_rl.driver.shared_run_dir)
    run_dir: str | None = None
    faults: FaultPlan = NO_FAULTS  # test-only (TOP_RL_FAULT): the faults the driver's code causes
    # what the machine and the environment decided (top_rl.driver.resolution.Resolution: contract, Ray's address, `auto`,
    # TOP_RL_* overrides); None: a plan built without it (a test)
    resolution: Any = None

    @property
    def ray_address(self) -> str | None:
        """The Ray cluster to join; None: a local Ray on this machine."""
        return self.resolution.ray_address if self.resolution else self.cluster.address
