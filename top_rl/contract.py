"""The TOP contract: what both sides of a true on-policy run must compute, pinned to one SGLang release.

`qwen3_dense_top_v1` describes SGLang 0.5.10.post1 serving a dense Qwen3 with
`--enable-deterministic-inference --rl-on-policy-target fsdp` (rl mode), as read from the pinned wheel
(shared/reference/sglang-0.5.10.post1-qwen3-numerics.md, cited by section below). Kernels, the model, the
trainer and the engine launchers read their dtype policy and flags from here; nothing else hard-codes them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class DtypePolicy:
    """The dtype at every cast of the Qwen3 forward. `compute` is the model dtype (bf16 in production,
    fp32 allowed for tests): GEMM inputs/outputs, attention, SiLU-mul, KV cache and logits live in it."""

    compute: torch.dtype
    embedding: torch.dtype = torch.float32  # §3: embed_tokens is fp32 in rl mode
    norm_weight: torch.dtype = torch.float32  # §3: every RMSNorm weight (q/k norm too) is fp32
    residual: torch.dtype = torch.float32  # §4.2: fp32_residual=True, x = f32(sublayer_out) + r
    norm_output: torch.dtype = torch.float32  # §4.2: override_orig_dtype=fp32 -> input/post/final norm out fp32
    rope: torch.dtype = torch.float32  # §4.5: q/k leave q_norm/k_norm in fp32, RoPE runs and caches in fp32
    prefill_logprob: torch.dtype = torch.float32  # §6.1: fp32 log-softmax of f32(logits), no temperature

    @property
    def sample_logprob(self) -> torch.dtype:
        """§6.2: the sampler's log-probs are log_softmax(bf(f32(bf(L))/T)) stored in the compute dtype."""
        return self.compute

    @property
    def linear_weight(self) -> torch.dtype:
        return self.compute

    @property
    def kv_cache(self) -> torch.dtype:
        return self.compute  # §3: --kv-cache-dtype auto == model dtype


@dataclass(frozen=True)
class GemmTiling:
    """Fixed shapes for the reference GEMM (DESIGN.md: measured on this project's CPUs).

    Rows are padded to a multiple of `row_tile` (fewer rows pick other BLAS kernels); output columns are
    computed `col_tile` at a time and K is reduced `k_chunk` at a time into fp32 partials summed left to
    right (a K of more than 512 per call is split differently with 1 and 2 threads). A row-parallel linear
    gathers the K-chunk partials of every rank and sums them in the same global order, so its bits do not
    depend on the TP degree; TP requires K / tp to be a multiple of `k_chunk`.
    """

    row_tile: int = 64
    col_tile: int = 128
    k_chunk: int = 64
    attn_kv_block: int = 64  # keys per online-softmax block in reference attention


# The batch-invariant GEMM both sides compute every linear with. SGLang 0.5.10.post1's `matmul_persistent` (the
# mm_BI its rl mode installs for aten::mm) runs DeepGEMM's bf16_gemm_nn when `deep_gemm` is importable on an
# sm90+ GPU and this switch is on (its default), else its Triton persistent kernel (§11.1). A contract names
# one path; the switch is derived from it for the engine's launch env and the trainer's process alike.
GEMM_ENV = "SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_DEEPGEMM"
GEMM_PATHS: dict[str, tuple[tuple[str, str], ...]] = {
    "triton_persistent": ((GEMM_ENV, "0"),),
    # DeepGEMM is used only when SGLang's JIT DeepGEMM is on as well (its configurer reads this at import).
    "deepgemm": ((GEMM_ENV, "1"), ("SGLANG_ENABLE_JIT_DEEPGEMM", "1")),
}


@dataclass(frozen=True)
class TopContract:
    name: str
    sglang_version: str
    tiling: GemmTiling
    # Engine flags every SGLang server of a TOP run gets (§1.1: pass both determinism flags, or piecewise
    # CUDA graphs stay on; §1.2: fp32 lm head, torch compile, mixed chunk, speculative decoding off).
    engine_flags: tuple[str, ...]
    base_engine_env: tuple[tuple[str, str], ...]  # pinned on both sides, beside the GEMM path's switches
    forbidden_env: tuple[str, ...]
    attention_backends: tuple[str, ...]
    radix_cache_required_off: tuple[str, ...]
    # Sampling settings under which returned log-probs are the sampled distribution's (§6.3-6.4).
    required_sampling: tuple[tuple[str, float | int], ...] = field(default=())
    # Attention backends whose decode kernel is proven (torch.equal on the GPU) to give the bits of its
    # extend/prefill kernel: only these may serve `logprob_source=decode`, where the gate compares the sampler's
    # decode-step log-probs with the trainer's prefill recompute. Empty: none is proven. Measured on an H200:
    # triton's split-KV decode differs from its extend on a few tokens; fa3 and flashinfer are unmeasured.
    decode_equals_extend: tuple[str, ...] = field(default=())
    gemm: str = "triton_persistent"  # a key of GEMM_PATHS

    def __post_init__(self):
        if self.gemm not in GEMM_PATHS:
            raise ValueError(f"contract {self.name!r}: gemm={self.gemm!r}; choose one of {sorted(GEMM_PATHS)}")
        gemm_keys = {k for path in GEMM_PATHS.values() for k, _ in path}
        clash = sorted(k for k, _ in self.base_engine_env if k in gemm_keys)
        if clash:
            raise ValueError(f"contract {self.name!r}: {clash} belong to the GEMM path; set `gemm`, not base_engine_env")

    @property
    def engine_env(self) -> tuple[tuple[str, str], ...]:
        """Every env var both sides pin: the GEMM path's switches, then the rest."""
        return GEMM_PATHS[self.gemm] + self.base_engine_env

    def policy(self, compute: torch.dtype | str) -> DtypePolicy:
        return DtypePolicy(compute=as_dtype(compute))

    def describe(self) -> dict:
        """A JSON-able description (dry-run plans, checkpoints, reports)."""
        out = dataclasses.asdict(self)
        out["tiling"] = dataclasses.asdict(self.tiling)
        out["engine_env"] = [list(kv) for kv in self.engine_env]
        return out


QWEN3_DENSE_TOP_V1 = TopContract(
    name="qwen3_dense_top_v1",
    sglang_version="0.5.10.post1",
    tiling=GemmTiling(),
    engine_flags=(
        "--enable-deterministic-inference",
        "--rl-on-policy-target",
        "fsdp",
        "--dtype",
        "bfloat16",
        "--kv-cache-dtype",
        "auto",
        "--disable-radix-cache",
        "--skip-tokenizer-init",
    ),
    base_engine_env=(("SGLANG_ENABLE_DETERMINISTIC_INFERENCE", "1"),),
    forbidden_env=("SGLANG_RETURN_ORIGINAL_LOGPROB", "SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_FALLBACK_VARIANT"),
    attention_backends=("fa3", "flashinfer", "triton"),
    radix_cache_required_off=("flashinfer",),
    required_sampling=(
        ("top_p", 1.0),
        ("top_k", -1),
        ("min_p", 0.0),
        ("frequency_penalty", 0.0),
        ("presence_penalty", 0.0),
        ("repetition_penalty", 1.0),
        ("min_new_tokens", 0),
    ),
    # §11.1: SGLang's Triton persistent GEMM, proven batch-invariant on the H200 (tests/gpu/test_invariance.py).
    gemm="triton_persistent",
)

# The same contract on DeepGEMM's bf16_gemm_nn (SGLang's own Hopper default, ~cuBLAS speed). Not yet a run option
# (`top.contract` chooses among CONTRACTS): its batch invariance is unproven on the lent H200, where no deep_gemm
# build loads (tests/gpu/test_deepgemm.py runs wherever one does). Code may name it (`get`, set_contract).
QWEN3_DENSE_TOP_V1_DEEPGEMM = dataclasses.replace(QWEN3_DENSE_TOP_V1, name="qwen3_dense_top_v1_deepgemm",
                                                  gemm="deepgemm")

CONTRACTS = {QWEN3_DENSE_TOP_V1.name: QWEN3_DENSE_TOP_V1}  # what a run config may choose
UNPROVEN = {QWEN3_DENSE_TOP_V1_DEEPGEMM.name: QWEN3_DENSE_TOP_V1_DEEPGEMM}
DEFAULT = QWEN3_DENSE_TOP_V1

_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32,
           "float64": torch.float64}


def as_dtype(d: torch.dtype | str) -> torch.dtype:
    if isinstance(d, torch.dtype):
        return d
    try:
        return _DTYPES[d]
    except KeyError:
        raise ValueError(f"unknown dtype {d!r}; use one of {sorted(_DTYPES)}") from None


def get(name: str) -> TopContract:
    try:
        return CONTRACTS.get(name) or UNPROVEN[name]
    except KeyError:
        raise ValueError(f"unknown TOP contract {name!r}; known: {sorted(CONTRACTS)} (unproven: "
                         f"{sorted(UNPROVEN)})") from None
