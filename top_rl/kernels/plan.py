"""Which kernel every op runs, decided once per process: the `KernelPlan`.

One frozen object names the backend, the TOP contract (its GEMM path), the attention kernel (the engines'
--attention-backend) and every fast-path switch. The driver builds it from the run config (`top.kernels`,
`top.contract`, `top.attention_backend`, `top.fast_paths`), records it in the resolved config (so state.json and
wandb carry it) and hands it to every actor as an argument (Ray pickles it to any node: no environment to forward);
each process installs it with one call, `top_rl.kernels.install(plan)`, before its first kernel runs. Ops read the
installed plan, never the environment.

`build` is the one place in the package that reads a `TOP_RL_*` kernel variable: a test or bench that runs kernels
without a run config (or a run started under such a variable, as scripts/gpu_run.sh does) gets the same switches as
before. A fast path switched either way keeps the forward's bits (the log-probs the gate compares). Five of the ten
keep the gradients too (fused_forward, fused_sampler, fused_head_mean, fused_backward, decode_graphs: off runs their
slower equal); the five in CHANGES_GRADIENTS (attention_backward, recompute_attention, recompute_gemm, flashinfer_lse,
fa3_lse) choose the backward's attention kernel, the recompute's forward or the LSE the backward reads (the forward
kernel's or FlashAttention-2's, equal to ~1e-3), so they change the gradients and the run's numbers from the first
update on.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from enum import StrEnum

from top_rl import contract as _contract
from top_rl.config.kernels import AttentionBackward, FastPaths  # noqa: F401 - also plan.FastPaths


# The switches that change the gradients (not the forward's bits): which backward kernel runs, which forward the
# recompute takes, whose LSE the flash backward reads. A resume that changes one changes the run's numbers
# (top_rl.run.resume_compat); the others are free.
CHANGES_GRADIENTS = frozenset({"attention_backward", "recompute_attention", "recompute_gemm", "flashinfer_lse",
                               "fa3_lse"})


@dataclass(frozen=True)
class KernelPlan:
    contract: str  # the run's TOP contract (top.contract): its GEMM path, tiling and attention backends
    backend: str = "reference"  # top_rl.kernels.KernelBackend: reference | plain | stock | sglang
    attention: str | None = None  # the engines' --attention-backend (sglang backend); None: not chosen
    fast_paths: FastPaths = field(default_factory=FastPaths)  # this plan's own copy (build), never the config's
    # where the run config said `auto`: the GPU the driver saw and the rule that chose `attention`
    # (top_rl.driver.backend_choice); None: the config named it
    attention_chosen_by: str | None = None

    def __post_init__(self):
        top = _contract.get(self.contract)  # an unknown name fails here, not at the first GEMM
        if self.attention is not None and self.attention not in top.attention_backends:
            raise ValueError(f"attention backend {self.attention!r} is not in the TOP contract {top.name!r}'s "
                             f"{top.attention_backends}")

    @property
    def top(self) -> _contract.TopContract:
        """The contract object this plan names."""
        return _contract.get(self.contract)

    def as_dict(self) -> dict:
        return {"backend": self.backend, "contract": self.contract, "attention": self.attention,
                **({"attention_chosen_by": self.attention_chosen_by} if self.attention_chosen_by else {}),
                "fast_paths": {k: str(v) if isinstance(v, StrEnum) else v
                               for k, v in dataclasses.asdict(self.fast_paths).items()}}


CONTRACT_ENV = "TOP_RL_CONTRACT"
ATTENTION_ENV = "TOP_RL_ATTENTION_BACKEND"
FAST_PATH_ENV = {f.name: f"TOP_RL_{f.name.upper()}" for f in dataclasses.fields(FastPaths)}


def _switch(name: str, value: str, default):
    var = FAST_PATH_ENV[name]
    if isinstance(default, bool):
        if value not in ("0", "1"):
            raise ValueError(f"{var}={value!r}; use 0 (off) or 1 (on), or top.fast_paths.{name}=false|true")
        return value == "1"
    try:
        return type(default)(value)
    except ValueError:
        raise ValueError(f"{var}={value!r}; choose one of {[m.value for m in type(default)]}") from None


def build(backend: str = "reference", contract: str | None = None, attention: str | None = None,
          fast_paths=None, environ=None, attention_chosen_by: str | None = None) -> KernelPlan:
    """The plan for these settings (a run passes its config's). `contract` / `attention` None: $TOP_RL_CONTRACT /
    $TOP_RL_ATTENTION_BACKEND, else contract.fallback() (a process with no run config: a test, a bench) / none
    chosen. `fast_paths` (FastPaths or the config's
    group; None: all on), each overridden by its $TOP_RL_<NAME> where set ("0" off, "1" on; attention_backward:
    flash | efficient), so a bench's A/B switch reaches a run's actors through the plan."""
    env = os.environ if environ is None else environ
    return KernelPlan(backend=str(backend), contract=contract or env.get(CONTRACT_ENV) or _contract.fallback().name,
                      attention=attention or env.get(ATTENTION_ENV) or None,
                      fast_paths=switches(fast_paths, env), attention_chosen_by=attention_chosen_by)


def switches(fast_paths=None, environ=None) -> FastPaths:
    """`fast_paths` (None: all defaults), each overridden by its $TOP_RL_<NAME> where set: a new FastPaths."""
    env = os.environ if environ is None else environ
    given = dataclasses.asdict(fast_paths) if fast_paths is not None else {}
    out = {}
    for f in dataclasses.fields(FastPaths):
        value = given.get(f.name, f.default)
        if env.get(FAST_PATH_ENV[f.name]):
            value = _switch(f.name, env[FAST_PATH_ENV[f.name]], f.default)
        out[f.name] = type(f.default)(value) if isinstance(f.default, StrEnum) else bool(value)
    return FastPaths(**out)


_installed: KernelPlan | None = None


def current() -> KernelPlan:
    """The plan installed in this process; none installed: `build()` (the defaults and the environment), installed."""
    global _installed
    if _installed is None:
        _installed = build()
    return _installed


def set_current(plan: KernelPlan | None) -> None:
    """Low level (top_rl.kernels.install is the one call a process makes)."""
    global _installed
    _installed = plan
