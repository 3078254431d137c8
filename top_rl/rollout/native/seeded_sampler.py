"""SGLang's seeded sampler in rl on-policy mode, the one way every engine here picks a token.

SGLang 0.5.11 (the same code in 0.5.10.post1), `--rl-on-policy-target` with deterministic inference and no top-k/top-p/min-p
(sglang/srt/layers/sampler.py: Sampler.forward -> _sample_from_logprobs -> multinomial_with_seed):
  logprobs = log_softmax(bf16(bf16(logits) / T))          kernels.sampler_log_softmax: the engine's bits
  hashed   = murmur_hash32(uint64(seed), positions, arange(V))   layers/utils/hash.py (0.5.17: kernels/ops/sampling/murmur_hash.py), uint32 [n, V]
  u        = float64(hashed) / 4294967295
  noise    = -log(-log(u) clamped to float64's lowest)    (Gumbel; float64 throughout)
  token    = argmax(noise + float64(logprobs))
`seed` is the request's `sampling_seed` (an int64 tensor; 42 when unset), `positions` the sequence length before
the sampled token minus 1: model_runner.py `sample()` passes `forward_batch.seq_lens - 1` at prefill and
`forward_batch.positions` at decode, which forward_batch_info.py sets to `clamp_position(seq_lens)` =
seq_lens - 1 (seq_lens counting the token being decoded). So the k-th new token (k = 0, 1, ...) of a prompt of
length P is drawn at position P + k - 1. A row's token depends only on its own logprobs, seed and position.

Which code runs:
- the hash: on CUDA, SGLang's own Triton `murmur_hash32` from the installed wheel (its file loaded alone: it needs
  only torch and triton; the package import would pull in the server's GPU dependencies); elsewhere (CPU, or no
  sglang/triton) `murmur_hash32_torch`, the same uint32 arithmetic in int64 with masks (tests/rollout/test_seeded_sampler.py
  runs SGLang's kernel in Triton's CPU interpreter against it);
- the Gumbel step: `gumbel_argmax`, SGLang's eager ops in its order. SGLang wraps its function in
  torch.compile(dynamic=True), whose CUDA code divides by the constant as a multiply by its reciprocal, as eager CUDA
  does for a CPU-scalar divisor; tests/gpu/test_seeded_sampler.py checks the tokens equal SGLang's compiled
  function's on CUDA. (Not SGLang's own function: importing sglang/srt/layers/sampler.py needs sgl_kernel and
  flashinfer on CUDA, and its compiled body cannot run on CPU.)
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import torch

UINT32_MAX = 4294967295  # torch.iinfo(torch.uint32).max, SGLang's divisor
INT64_RANGE = (-(2**63), 2**63 - 1)  # SGLang builds sampling_seed as an int64 tensor
_M32 = 0xFFFFFFFF
_C1, _C2, _N = 0xCC9E2D51, 0x1B873593, 0xE6546B64
_F1, _F2 = 0x85EBCA6B, 0xC2B2AE35


def check_seeds(seeds) -> None:
    lo, hi = INT64_RANGE
    bad = [s for s in seeds if not lo <= int(s) <= hi]
    if bad:
        raise ValueError(f"sampling seed {bad[0]} is outside int64: SGLang's sampling_seed is an int64 tensor")


# ------------------------------------------------------------------------------------------ murmur3 in int64
def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """(a * c) mod 2**32 for a in [0, 2**32), without an int64 overflow: a = hi * 2**16 + lo."""
    return ((a & 0xFFFF) * c + (((a >> 16) * c) & 0xFFFF) * 65536) & _M32


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _M32


def _scramble(k: torch.Tensor) -> torch.Tensor:
    return _mul32(_rotl32(_mul32(k, _C1), 15), _C2)


def _mix_scrambled(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return (_rotl32(h ^ k, 13) * 5 + _N) & _M32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, _F1)
    h = h ^ (h >> 13)
    h = _mul32(h, _F2)
    return h ^ (h >> 16)


def murmur_hash32_torch(seeds: torch.Tensor, positions: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """SGLang's murmur_hash32_kernel: blocks seed low, seed high, uint32(position), uint32(col), length 16; int64
    values in [0, 2**32), [n, len(cols)]. The row blocks are mixed once per row, the column block once per column."""
    seeds, positions, cols = seeds.to(torch.int64), positions.to(torch.int64), cols.to(torch.int64)
    h = torch.zeros_like(seeds)
    for block in (seeds & _M32, (seeds >> 32) & _M32, positions & _M32):
        h = _mix_scrambled(h, _scramble(block))
    h = _mix_scrambled(h[:, None], _scramble(cols & _M32)[None, :])
    return _fmix32(h ^ 16)


# ------------------------------------------------------------------------------------------ SGLang's kernel
@functools.cache
def sglang_murmur_hash32():
    """SGLang's own `murmur_hash32` (Triton), or None where the wheel or triton is missing. Its file is where the
    installed release's adapter says (top_rl/sglang_release.py); a release without one, or a wheel without that file,
    is refused rather than silently served by the torch hash."""
    from top_rl import sglang_release

    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        return None
    release = sglang_release.installed()  # refuses an unknown release, naming the ones with a contract
    path = Path(spec.origin).parent / release.murmur_hash_file
    if not path.is_file():
        raise RuntimeError(f"SGLang {release.version}'s murmur_hash32 is not at {path} (top_rl/sglang_release.py)")
    try:
        file_spec = importlib.util.spec_from_file_location("_top_rl_sglang_hash", path)
        mod = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(mod)
        return mod.murmur_hash32
    except Exception:  # noqa: BLE001 - no triton: the torch version computes the same
        return None


def hash_impl(device: torch.device) -> str:
    """Which hash `multinomial_with_seed` runs on `device`: "sglang-triton" or "torch"."""
    return "sglang-triton" if torch.device(device).type == "cuda" and sglang_murmur_hash32() is not None else "torch"


def murmur_hash32(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """The [n, vocab] hash SGLang draws its uniforms from (uint32 from SGLang's kernel, int64 from ours)."""
    cols = torch.arange(vocab, device=seeds.device)
    if hash_impl(seeds.device) == "sglang-triton":
        return sglang_murmur_hash32()(seeds.to(torch.uint64), positions.to(torch.int64), cols)
    return murmur_hash32_torch(seeds, positions, cols)


# ------------------------------------------------------------------------------------------ the Gumbel step
def gumbel_argmax(logprobs: torch.Tensor, hashed: torch.Tensor) -> torch.Tensor:
    """multinomial_with_seed after its hash, op for op: uniforms, Gumbel noise in float64, argmax. [n] int64."""
    x = hashed.to(torch.float64) / UINT32_MAX
    x.log_().clamp_(min=torch.finfo(x.dtype).min).neg_()
    x.log_().neg_()
    x.add_(logprobs.to(torch.float64))
    return torch.argmax(x, dim=1)


def multinomial_with_seed(logprobs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The token SGLang's rl-mode sampler picks for each row: logprobs [n, V] (the sampler's log-softmax), seeds
    [n] int64 (sampling_seed), positions [n] (sequence length before the token, minus 1). Returns [n] int64."""
    return gumbel_argmax(logprobs, murmur_hash32(seeds, positions, logprobs.shape[-1]))
