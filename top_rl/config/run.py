"""The run's typed config: one dataclass per component, composed here and registered with Hydra as the schema of
top_rl/conf/config.yaml. Schema only: every section is plain data, one module of this package each, so the package
imports nothing of top_rl outside itself (tests/repo/test_architecture.py). Values are checked by
top_rl.config_checks.validate; what the environment and the machine decide (the contract, Ray's address, `auto`, a
bench's TOP_RL_* switches) by top_rl.driver.resolution."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum

from top_rl.config.algo import AlgoConfig, GateConfig
from top_rl.config.checkpoint import CheckpointConfig
from top_rl.config.cluster import ClusterConfig
from top_rl.config.eval import EvalConfig
from top_rl.config.kernels import AttentionBackend, FastPaths, KernelBackend
from top_rl.config.model import ModelConfig
from top_rl.config.rollout import RolloutConfig
from top_rl.config.task import TaskConfig
from top_rl.config.tracking import TrackingConfig
from top_rl.config.trainer import TrainerConfig

# top.contract's default: the contract of the SGLang release installed where the run resolves
# (top_rl.driver.resolution), never a name read from the installed release when this module is imported.
INSTALLED = "installed"


@dataclass
class TopConfig(GateConfig):
    """TOP's switch and gate (GateConfig: enabled, on_violation; the trainer's gate reads this object itself), and
    what both sides run: the contract, its kernels and the attention backend. enabled=false is the non-TOP
    baseline (the `stock` kernels both sides, parity logged, no gate)."""

    # A name in top_rl.contract.CONTRACTS, or `installed`: the contract of the SGLang release this machine holds
    # (the native engine's default where none is installed), decided once on the driver (top_rl.driver.resolution)
    # and passed to everything below as an argument (the KernelPlan carries it to the actors).
    contract: str = INSTALLED
    kernels: KernelBackend = KernelBackend.reference  # reference (CPU/any device) | sglang (GPU); stock is the baseline's
    # = the SGLang engines' --attention-backend. auto: decided on the driver from its GPU (top_rl/driver/backend_choice.py):
    # fa3 on Hopper where the contract proves fa3's decode equal to its extend, else triton
    attention_backend: AttentionBackend = AttentionBackend.triton
    fast_paths: FastPaths = field(default_factory=FastPaths)  # speed switches (plan.py: 3 change the gradients)


# RunConfig() is the run `top-rl` makes without overrides: every default is stated once, here and in the sections'
# dataclasses (the embedded CPU job's); top_rl/conf/config.yaml names the groups, whose files hold only what an
# alternative changes (tests/entry/test_config.py composes it and checks both).
@dataclass
class RunConfig:
    # everything the run writes: metrics.jsonl, kernels.json, checkpoints/, wandb/, parity/
    run_dir: str = "runs/default"
    steps: int = 70  # RL steps (rollout, gate, update, weight push) the run makes
    seed: int = 0  # the driver's seed: the prompt order and every sampling seed (seed, step, sample)
    resume: bool = False  # continue run_dir from its newest checkpoint that verifies (refused when there is none)
    resume_allow_changes: bool = False  # resume even if determinism-relevant settings changed
    dry_run: bool = False  # print the run's resolved plan as JSON (engines, trainer layout, contract) and exit
    model: ModelConfig = field(default_factory=ModelConfig)
    # The task group's config (a TaskConfig subclass: top_rl.tasks.TASKS); Hydra's task group picks which (arith:
    # the defaults list's, whose dataclass holds its defaults).
    task: TaskConfig = field(default_factory=lambda: TaskConfig(name="arith"))
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    top: TopConfig = field(default_factory=TopConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)  # eval.every: an eval every K steps

    def as_dict(self) -> dict:
        return plain(dataclasses.asdict(self))


def kernel_backend(cfg: RunConfig) -> str:
    """The kernel backend every actor runs: the contract's kernels under TOP, the `stock` kernels for the baseline
    (fast stock kernels on CUDA, plain torch's ops elsewhere: top_rl/kernels/stock.py)."""
    return (cfg.top.kernels if cfg.top.enabled else KernelBackend.stock).value


def plain(v):
    """A config tree (dataclasses.asdict's) with its enums as their values: what JSON, wandb and a resume compare."""
    if isinstance(v, Enum):
        return v.value
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v
