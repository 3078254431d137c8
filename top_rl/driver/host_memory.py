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
- On a local run, every native engine that computes on the CPU generates all the rows of its call at once (its share
  of the step's samples, or cluster.rollout_chunk of them per wave) and holds, for the whole call, the KV cache of
  every row: each of its (>= 1 prompt + rollout.max_new_tokens) positions keeps a K and a V vector per layer and KV
  head, in model.dtype (top_rl/rollout/native.py: model.new_kv_cache(rows, longest prompt + max_new_tokens)). Its
  activations, logits and the samples it returns are not counted (measured: the tiny default model's call takes
  ~75 KB a row on the reference kernels, its KV cache ~1.5 KB of it).
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


@dataclass(frozen=True)
class CpuEngineCalls:
    """What the native engines computing on the CPU hold during one generate call each (module doc)."""

    engines: int
    rows: int  # samples in one engine's call
    positions: int  # >= 1 prompt token + rollout.max_new_tokens
    kv_position_bytes: int  # one row's K and V at one position, over every layer and KV head

    @property
    def bytes(self) -> int:
        return self.engines * self.rows * self.positions * self.kv_position_bytes

    def describe(self) -> str:
        return (f"{_size(self.bytes)} for the KV cache of {self.engines} CPU engine(s)' generate call(s) ({self.rows:,} "
                f"rows a call x (>= {MIN_PROMPT_TOKENS} prompt token + rollout.max_new_tokens={self.positions - MIN_PROMPT_TOKENS}) "
                f"positions x {self.kv_position_bytes:,} B)")


def cpu_engine_calls(arch, dtype: str, engines: int, samples: int, rollout_chunk: int, max_new_tokens: int) -> CpuEngineCalls:
    """`samples`: the step's (prompts_per_step x n_samples), split over the run's `engines` (all on the CPU: a call's
    rows are ceil(wave / engines), a wave the whole step or rollout_chunk per engine: top_rl.driver.cluster)."""
    rows = -(-samples // max(1, engines))
    if rollout_chunk > 0:
        rows = min(rows, rollout_chunk)
    kv = arch.num_hidden_layers * 2 * arch.num_key_value_heads * arch.head_dim * (4 if dtype == "float32" else 2)
    return CpuEngineCalls(engines, rows, MIN_PROMPT_TOKENS + max_new_tokens, kv)


def cpu_models(arch, dtype: str, engines: int, trainer_replicas: int) -> CpuModels:
    return CpuModels(param_count(arch), 4 if dtype == "float32" else 2, engines, trainer_replicas)


def _size(n: int) -> str:
    return f"{n / GIB:,.1f} GiB"


def refusal(prompts: int, n_samples: int, max_new_tokens: int, models: CpuModels | None, host: int,
            calls: CpuEngineCalls | None = None) -> str | None:
    """Why this host cannot hold the run (None: these lower bounds fit), with the numbers and the fix."""
    per_sample = sample_bytes(max_new_tokens)
    batch = prompts * n_samples * per_sample
    engine = calls.bytes if calls else 0
    model = models.bytes if models else 0
    fixed = model  # what does not grow with rollout.prompts_per_step
    if calls is not None and calls.engines and calls.rows == -(-prompts * n_samples // calls.engines):
        # one call per engine holds its whole share of the step (no cluster.rollout_chunk cap): a prompt more is
        # its samples' KV cache more, too
        per_sample += calls.positions * calls.kv_position_bytes
    else:
        fixed += engine
    per_prompt = n_samples * per_sample
    if batch + engine + model <= host:
        return None
    parts = [f"{_size(batch)} for a step's batch on the driver (rollout.prompts_per_step={prompts} x rollout.n_samples={n_samples} "
             f"samples x (>= {MIN_PROMPT_TOKENS} prompt token x {PROMPT_TOKEN_BYTES} B + rollout.max_new_tokens="
             f"{max_new_tokens} x {RESPONSE_TOKEN_BYTES} B))"] if batch * 100 >= host else []
    parts += [calls.describe()] if engine * 100 >= host else []
    parts += [models.describe()] if model * 100 >= host else []  # a part under 1% of the host is not the story
    fixes = []
    if fixed < host:
        fixes.append(f"lower rollout.prompts_per_step (over {(host - fixed) // per_prompt:,} cannot fit here), "
                     "rollout.n_samples or rollout.max_new_tokens")
    if engine * 100 >= host:
        fixes.append("cap the rows an engine's call holds (cluster.rollout_chunk: samples per engine call), or put "
                     "the engines on GPUs (cluster.engine_gpus)")
    if model * 2 > host:
        fixes.append("a smaller model (model.*), or actors on GPUs (cluster.engine_gpus, cluster.trainer_gpus)")
    fix = "; or ".join(fixes)
    return (f"this host's {_size(host)} of memory cannot hold the run: it needs at least {' + '.join(parts)}"
            f"{f' = {_size(batch + engine + model)}' if len(parts) > 1 else ''}. {fix[0].upper()}{fix[1:]}")
