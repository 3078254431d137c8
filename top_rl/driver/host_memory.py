"""Whether a run's sizes fit this host's memory, checked before anything starts (top_rl.preflight.host_memory). The
numbers are lower bounds of what the run allocates, counted from the objects it builds: a run refused here could
never have run (it would have grown until the machine killed it, deep in a step); one that passes may still not fit.

- The step's batch, on the driver. Every step the driver holds all rollout.prompts_per_step x rollout.n_samples
  samples at once: the engines' RolloutSamples and the RLBatch built from them (top_rl/driver/step_batch.py). Each
  token is a 64-bit slot in both (its id, prompt and response alike), and each response token also has two log-probs (the
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
  head, in model.dtype (top_rl/rollout/native.py: model.new_kv_cache(rows, longest prompt + max_new_tokens)). On top
  of it, every row's share of the call's largest working set, the largest of (call_scratch):
  - the sampler (every backend; a CPU engine hashes with the torch murmur3): a [rows, vocab] logits and log-probs in
    model.dtype, the int64 hash and the float64 Gumbel noise plus the float64 copy of the log-probs it adds, all alive
    at once in seeded_sampler.gumbel_argmax;
  - on the reference kernels (TOP's CPU kernels) and only when decode steps run (rollout.max_new_tokens >= 2: the
    prompt's prefill goes in chunks of PREFILL_TOKENS_PER_CALL tokens, so its scratch does not grow with the rows):
    the decode step's vocab head and gate_up GEMMs, whose fixed-shape tiling keeps fp32 partials of every K-chunk
    [ceil(hidden / k_chunk), rows, N padded to col_tile] plus their fp32 sum (tiled_gemm.k_partials, fold); and the
    decode attention of a layer (reference_attention.decode_attention), which gathers every query head's first key
    block of K and of V and their product, 3 x [rows x heads, attn_kv_block, head_dim] fp32, after copying the cache
    into fp32 [rows x KV heads, positions padded to attn_kv_block, head_dim] K and V (a copy whenever the cache is not
    fp32 or there are several KV heads and rows).
  Hidden states, the [rows, max_new_tokens] tokens and log-probs, Python objects and the allocator's slack are not
  counted. Measured (tests/driver/test_host_memory.py: the most bytes of tensor storage alive at once during one call
  of one-token prompts, max_new_tokens=2; a fresh process's peak RSS agreed from 1k to 16k rows): the default tiny
  model (vocab 18, hidden 64, 4 heads / 2 KV heads of 16) holds ~72 KB a row on the reference kernels in fp32 and bf16,
  and the bound counts ~66 KB (1.5 KB of it KV cache, 64 KB the attention's key blocks); with vocab 4096, ~198 KB a
  row against 133 KB counted (the sampler). The plain kernels (top.enabled=false) hold ~5 KB a row of the tiny model;
  only the KV cache and the sampler (2.1 KB) count.
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
    scratch_row_bytes: int = 0  # one row's share of the call's largest working set (call_scratch)
    scratch: str = ""  # which one

    @property
    def row_bytes(self) -> int:
        return self.positions * self.kv_position_bytes + self.scratch_row_bytes

    @property
    def bytes(self) -> int:
        return self.engines * self.rows * self.row_bytes

    def describe(self) -> str:
        kv = (f"(>= {MIN_PROMPT_TOKENS} prompt token + rollout.max_new_tokens={self.positions - MIN_PROMPT_TOKENS}) "
              f"positions x {self.kv_position_bytes:,} B of KV cache")
        held = f"{kv} + {self.scratch_row_bytes:,} B for {self.scratch}" if self.scratch_row_bytes else kv
        return (f"{_size(self.bytes)} for {self.engines} CPU engine(s)' generate call(s) ({self.rows:,} rows a call x "
                f"{self.row_bytes:,} B: {held})")


def _padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def call_scratch(arch, dtype: str, reference: bool, max_new_tokens: int, tiling=None, rows: int = 2) -> tuple[int, str]:
    """One row's share of the largest working set a native CPU engine's generate call allocates besides its KV cache,
    and what it is (module doc): lower bounds read off the code, every tensor counted alive at once with the others."""
    from top_rl.contract import GemmTiling

    t = tiling or GemmTiling()
    c = 4 if dtype == "float32" else 2  # the compute dtype: logits, log-probs, KV cache
    vocab, hidden = arch.vocab_size, arch.hidden_size
    sets = {f"the sampler's [rows, vocab={vocab:,}] logits and log-probs ({c} B each), int64 hash and float64 "
            "Gumbel noise and log-probs": vocab * (2 * c + 8 + 8 + 8)}
    if reference and max_new_tokens >= 2:
        chunks = -(-hidden // t.k_chunk)
        gemm = lambda n: 4 * (chunks * _padded(n, t.col_tile) + n)  # noqa: E731  fp32 partials and their sum
        sets[f"the reference GEMM's fp32 partials of the vocab head ({chunks} K-chunk(s) x vocab={vocab:,} padded to "
             f"{t.col_tile})"] = gemm(vocab)
        sets[f"the reference GEMM's fp32 partials of gate_up ({chunks} K-chunk(s) x 2 x intermediate_size="
             f"{arch.intermediate_size:,} padded to {t.col_tile})"] = gemm(2 * arch.intermediate_size)
        heads, kv_heads, d, blk = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim, t.attn_kv_block
        attention = 3 * heads * blk * d * 4  # the first key block of K and V and their product, every query head
        copied = c != 4 or (kv_heads > 1 and rows > 1)  # the fp32 K and V of every KV head (a view otherwise)
        attention += 2 * kv_heads * _padded(MIN_PROMPT_TOKENS + max_new_tokens, blk) * d * 4 if copied else 0
        sets[f"the reference decode attention's fp32 key blocks ({heads} heads x attn_kv_block={blk} x head_dim={d}"
             f"{', and the cache in fp32' if copied else ''})"] = attention
    what = max(sets, key=sets.get)
    return sets[what], what


def cpu_engine_calls(arch, dtype: str, engines: int, samples: int, rollout_chunk: int, max_new_tokens: int,
                     reference: bool = True, tiling=None) -> CpuEngineCalls:
    """`samples`: the step's (prompts_per_step x n_samples), split over the run's `engines` (all on the CPU: a call's
    rows are ceil(wave / engines), a wave the whole step or rollout_chunk per engine: top_rl.driver.cluster).
    `reference`: the engines compute with the reference kernels (top_rl.config.kernel_backend), `tiling` their
    contract's GemmTiling (None: the default's)."""
    rows = -(-samples // max(1, engines))
    if rollout_chunk > 0:
        rows = min(rows, rollout_chunk)
    kv = arch.num_hidden_layers * 2 * arch.num_key_value_heads * arch.head_dim * (4 if dtype == "float32" else 2)
    scratch, what = call_scratch(arch, dtype, reference, max_new_tokens, tiling, rows)
    return CpuEngineCalls(engines, rows, MIN_PROMPT_TOKENS + max_new_tokens, kv, scratch, what)


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
        # its samples' KV cache and scratch more, too
        per_sample += calls.row_bytes
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
