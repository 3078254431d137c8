"""What `auto` means for `top.attention_backend` and `rollout.logprob_source`: decided once, on the driver, from the GPU
it sees and the run's contract, written into the run config (so state.json, wandb and a resume compare the values that
ran) and recorded in the KernelPlan (every actor's entry in run_dir/kernels.json says why).

The rule (one table, `choose`):
- Hopper (sm90) and a contract that lists fa3 in `decode_equals_extend` (the fa3 decode kernel proven, on a live
  server, to give its extend kernel's bits: docs/numerics.md §FA3): **fa3 with the decode source**. The gate then proves
  the sampler's own log-probs, the distribution the tokens were drawn from, and the prefill re-score pass goes.
- Anywhere else, and on Hopper under a contract without that proof (SGLang 0.5.17's today): **triton with the prefill
  source** (the engine re-scores each sample). Triton runs on every GPU SGLang supports; Blackwell has no fa3 in SGLang.
- No GPU visible: the same fallback for a local run or a dry run (a local run without a GPU cannot run the `sglang`
  kernels anyway, and says so later); a run on a Ray cluster whose driver sees no GPU is refused: the choice would not
  be the engines' GPUs', so the user names the backend.
Only the keys set to `auto` are decided: `top.attention_backend=fa3 rollout.logprob_source=auto` takes decode where
fa3 is proven, prefill elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from top_rl import contract
from top_rl.config.kernels import AttentionBackend
from top_rl.driver.local_gpu import LocalGpu, local_gpu

AUTO = "auto"


@dataclass(frozen=True)
class BackendChoice:
    attention_backend: str
    logprob_source: str
    why: str  # one line: the GPU seen and the rule that applied (kernels.json, the dry-run plan, the start-up line)


def choose(top: contract.TopContract, gpu: LocalGpu | None, attention: str = AUTO, source: str = AUTO) -> BackendChoice:
    """The backend and log-prob source for `top` on `gpu`, keeping whichever of the two is not `auto`."""
    seen = f"{gpu.describe()}" if gpu else "no GPU visible to the driver"
    if attention == AUTO:
        if gpu is not None and gpu.is_hopper and "fa3" in top.decode_equals_extend:
            attention, rule = "fa3", f"Hopper: fa3's decode is proven equal to its extend under {top.name}"
        elif gpu is not None and gpu.is_hopper:
            attention, rule = "triton", f"Hopper, but fa3's decode is not proven equal to its extend under {top.name}"
        else:
            attention, rule = "triton", "not Hopper: SGLang's fa3 serves Hopper only"
    else:
        rule = f"top.attention_backend={attention} as set"
    if source == AUTO:
        source = "decode" if attention in top.decode_equals_extend else "prefill"
    return BackendChoice(attention, source, f"{seen}: {rule} -> attention {attention}, {source} log-probs gated")


def resolve(cfg, on_cluster: bool) -> BackendChoice | None:
    """Decide cfg's `auto` keys in place (None: neither is auto). Refuses (ValueError naming the keys) a run on a Ray
    cluster (`on_cluster`: top_rl.driver.resolution decides where Ray runs) whose driver sees no GPU."""
    attention, source = str(cfg.top.attention_backend), str(cfg.rollout.logprob_source)
    top = contract.CONTRACTS.get(cfg.top.contract)
    if AUTO not in (attention, source) or top is None:  # an unknown contract: config_values refuses it by name
        return None
    gpu = local_gpu()
    if gpu is None and on_cluster and not cfg.dry_run:
        keys = " and ".join(k for k, v in (("top.attention_backend", attention), ("rollout.logprob_source", source))
                            if v == AUTO)
        raise ValueError(f"{keys}=auto: the driver sees no GPU to decide from on this Ray cluster; name them for the "
                         "engines' GPUs: on Hopper top.attention_backend=fa3 rollout.logprob_source=decode (where the "
                         "contract proves fa3's decode), elsewhere top.attention_backend=triton "
                         "rollout.logprob_source=prefill")
    choice = choose(top, gpu, attention, source)
    cfg.top.attention_backend = AttentionBackend(choice.attention_backend)
    from top_rl.config.rollout import LogprobSource

    cfg.rollout.logprob_source = LogprobSource(choice.logprob_source)
    return choice
