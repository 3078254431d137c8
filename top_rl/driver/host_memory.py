"""Whether a run's sizes fit this host's memory, checked before anything starts (top_rl.preflight.host_memory). The
numbers are lower bounds of what the run allocates, counted from the objects it builds: a run refused here could
never have run (it would have grown until the machine killed it, deep in a step); one that passes may still not fit.

- The step's batch, on the driver. Every step the driver holds all rollout.prompts_per_step x rollout.n_samples
  samples at once: the engines' RolloutSamples and the RLBatch built from them (top_rl/loop.py). Each token is a
  64-bit slot in both (its id, prompt and response alike), and each response token also has two log-probs (the
  gate's and the sampler's), Python floats of 24 bytes, each held by a slot in both. A prompt has at least one token;
  a response may run to rollout.max_new_tokens, and the run must hold the step where every response does. Object
  headers, token ids above 256 (Python caches only the small ones) and the lists' spare room are not counted.
- On a local run, every actor that computes on the CPU keeps its model in this host's memory: an engine its weights
  (model.dtype), a trainer rank its shard's weights, their fp32 master copy (unless they are fp32), their fp32
  gradients and Adam's two fp32 moments (top_rl.train.optim.CpuAdamW). The trainer ranks' shards together hold the
  whole model once per data- and context-parallel replica.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from top_rl.rollout.sglang_memory import param_count

GIB = 1 << 30
SLOT_BYTES = 8  # a list or tuple entry
FLOAT_BYTES = 24  # a Python float
PROMPT_TOKEN_BYTES = 2 * SLOT_BYTES  # its id in the RolloutSample and in the RLSample
RESPONSE_TOKEN_BYTES = 6 * SLOT_BYTES + 2 * FLOAT_BYTES  # id x 2, two log-probs x 2 slots, the two floats
MIN_PROMPT_TOKENS = 1
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # v2, v1


def host_bytes() -> int:
    """This host's physical memory, or its cgroup's limit where that is lower (a container)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in CGROUP_LIMITS:
        try:
            value = Path(limit).read_text().strip()
        except OSError:
            continue
        if value.isdigit():  # "max": no limit
            total = min(total, int(value))
    return total


def sample_bytes(max_new_tokens: int) -> int:
    """The least one sample of a step costs the driver (module doc)."""
    return MIN_PROMPT_TOKENS * PROMPT_TOKEN_BYTES + max_new_tokens * RESPONSE_TOKEN_BYTES


@dataclass(frozen=True)
class CpuModels:
    """The models that actors computing on the CPU keep in this host's memory (module doc)."""

    params: int
    weight_bytes: int  # per parameter, in model.dtype
    engines: int
    trainer_replicas: int  # dp x cp: the trainer ranks' shards hold the whole model this many times

    @property
    def trainer_param_bytes(self) -> int:
        return self.weight_bytes + (0 if self.weight_bytes == 4 else 4) + 4 + 8  # master, gradient, two moments

    @property
    def bytes(self) -> int:
        return self.params * (self.engines * self.weight_bytes + self.trainer_replicas * self.trainer_param_bytes)

    def describe(self) -> str:
        held = [f"{self.engines} engine(s) x {self.weight_bytes} B"] if self.engines else []
        held += [f"{self.trainer_replicas} trainer replica(s) x {self.trainer_param_bytes} B"] if self.trainer_replicas else []
        return f"{_size(self.bytes)} for the CPU actors' models ({self.params:,} parameters x ({' + '.join(held)}))"


def cpu_models(arch, dtype: str, engines: int, trainer_replicas: int) -> CpuModels:
    return CpuModels(param_count(arch), 4 if dtype == "float32" else 2, engines, trainer_replicas)


def _size(n: int) -> str:
    return f"{n / GIB:,.1f} GiB"


def refusal(prompts: int, n_samples: int, max_new_tokens: int, models: CpuModels | None, host: int) -> str | None:
    """Why this host cannot hold the run (None: these lower bounds fit), with the numbers and the fix."""
    per_prompt = n_samples * sample_bytes(max_new_tokens)
    batch = prompts * per_prompt
    model = models.bytes if models else 0
    if batch + model <= host:
        return None
    parts = [f"{_size(batch)} for a step's batch on the driver (rollout.prompts_per_step={prompts} x rollout.n_samples={n_samples} "
             f"samples x (>= {MIN_PROMPT_TOKENS} prompt token x {PROMPT_TOKEN_BYTES} B + rollout.max_new_tokens="
             f"{max_new_tokens} x {RESPONSE_TOKEN_BYTES} B))"] if batch * 100 >= host else []
    parts += [models.describe()] if model * 100 >= host else []  # a part under 1% of the host is not the story
    fixes = []
    if model < host:
        fixes.append(f"lower rollout.prompts_per_step (over {(host - model) // per_prompt:,} cannot fit here), "
                     "rollout.n_samples or rollout.max_new_tokens")
    if model * 2 > host:
        fixes.append("a smaller model (model.*), or actors on GPUs (cluster.engine_gpus, cluster.trainer_gpus)")
    fix = "; or ".join(fixes)
    return (f"this host's {_size(host)} of memory cannot hold the run: it needs at least {' + '.join(parts)}"
            f"{f' = {_size(batch + model)}' if len(parts) > 1 else ''}. {fix[0].upper()}{fix[1:]}")
