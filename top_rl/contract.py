"""The TOP contract: what both sides of a true on-policy run must compute, pinned to one SGLang release.

`qwen3_dense_top_v1` describes SGLang 0.5.11 serving a dense Qwen3 with
`--enable-deterministic-inference --rl-on-policy-target fsdp` (rl mode), as read from the pinned wheel
(docs/numerics.md, cited by section below). Kernels, the model, the
trainer and the engine launchers read their dtype policy and flags from here; nothing else hard-codes them.
Plain data (no torch): the run config imports it; the dtype policy's torch types live in top_rl/dtypes.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GemmTiling:
    """Fixed shapes for the reference GEMM (docs/architecture.md: measured on this project's CPUs).

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


# The batch-invariant GEMM both sides compute every linear with. SGLang 0.5.11's `matmul_persistent` (the
# mm_BI its rl mode installs for aten::mm) runs DeepGEMM's bf16_gemm_nn when `deep_gemm` is importable on an
# sm90+ GPU and this switch is on (its default), else its Triton persistent kernel (§11.1). A contract names
# one path; the switch is derived from it for the engine's launch env and the trainer's process alike.
GEMM_ENV = "SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_DEEPGEMM"
GEMM_PATHS: dict[str, tuple[tuple[str, str], ...]] = {
    "triton_persistent": ((GEMM_ENV, "0"),),
    # DeepGEMM is used only when SGLang's JIT DeepGEMM is on as well (its configurer reads this at import).
    "deepgemm": ((GEMM_ENV, "1"), ("SGLANG_ENABLE_JIT_DEEPGEMM", "1")),
}


# The engine's DeepGEMM (gemm="deepgemm"): sglang 0.5.11 pins sglang-kernel 0.4.2, whose `deep_gemm` package sgl-kernel
# builds from sgl-project/DeepGEMM at this commit (its package files equal the wheel's, and equal 0.4.1's file for file:
# the digest below is unchanged since sglang 0.5.10.post1 / sglang-kernel 0.4.1). The JIT compiles
# every kernel from the package's include/ headers, driven by its Python files: both sides must hold these, and a
# trainer build records the commit of its host code (top_rl/kernels/sglang/deep_gemm_source.py).
DEEPGEMM_SOURCE = {
    "package": "sglang-kernel==0.4.2 (deep_gemm)",
    "rev": "ffe2b6b97420a9f8c58268ca55755168e6e2f360",
    "sources_sha256": "ea12e5d7e9c79994533743178d27be7154dc59d350d915fbd045a4987133a7bc",  # include/ + *.py
}


_BOOL_WORDS = {"true": True, "1": True, "yes": True, "y": True, "false": False, "0": False, "no": False, "n": False}


def same_env_value(have: str, want: str) -> bool:
    """Whether an env var's value means what the contract pins. SGLang reads its switches as booleans
    (sglang/srt/environ.py EnvBool: true/1/yes/y, false/0/no/n) and 0.5.11's ServerArgs writes them back as
    "True"/"False" in-process, so "True" and "1" are the same switch; other values compare as strings."""
    have, want = str(have), str(want)
    a, b = _BOOL_WORDS.get(have.strip().lower()), _BOOL_WORDS.get(want.strip().lower())
    return a == b if a is not None and b is not None else have == want


# Server flags a TOP run leaves off, and why (§1.2). Set through extra_args they are refused before Ray starts
# (top_rl.rollout.sglang.launch.check_extra_args: by SGLang's own parser where the pinned release imports, else by name).
ENGINE_FLAGS_OFF = (
    ("--enable-fp32-lm-head", "it takes precedence over the rl-mode LM head, whose log-probs the trainer computes"),
    ("--enable-torch-compile", "torch.compile changes the kernels the trainer reproduces"),
    ("--enable-mixed-chunk", "it mixes prefill and decode chunks, changing batch shapes"),
    ("--speculative-algorithm", "speculative decoding changes kernels and batch shapes"),
    ("--quantization", "quantized GEMMs are not the trainer's"),
    ("--enable-lora", "LoRA adds GEMMs the trainer does not compute"),
    # new in 0.5.11
    ("--debug-cuda-graph", "decode graphs become breakable graphs that run eagerly"),
    ("--enable-breakable-cuda-graph", "breakable graphs replace the decode graphs"),
    ("--enable-quant-communications", "quantized all-reduces change TP>1 sums"),
)


@dataclass(frozen=True)
class TopContract:
    name: str
    sglang_version: str  # a key of top_rl.sglang_release.RELEASES: the release's adapter (module paths, dests, ...)
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
    # Attention backends whose decode kernel is proven (torch.equal on the GPU, against a live server of this release:
    # tests/gpu/test_fa3_decode.py) to give the bits of its extend/prefill kernel: only these may serve
    # `logprob_source=decode`, where the gate compares the sampler's decode-step log-probs with the trainer's prefill
    # recompute. Empty: none is proven. triton's split-KV decode differs from its extend on ~7% of tokens (H100, H200)
    # and flashinfer's on a few: they stay on the prefill re-score.
    decode_equals_extend: tuple[str, ...] = field(default=())
    gemm: str = "triton_persistent"  # a key of GEMM_PATHS
    engine_flags_off: tuple[tuple[str, str], ...] = ENGINE_FLAGS_OFF  # (flag, why) pairs, §1.2

    def __post_init__(self):
        if self.gemm not in GEMM_PATHS:
            raise ValueError(f"contract {self.name!r}: gemm={self.gemm!r}; choose one of {sorted(GEMM_PATHS)}")
        gemm_keys = {k for path in GEMM_PATHS.values() for k, _ in path}
        clash = sorted(k for k, _ in self.base_engine_env if k in gemm_keys)
        if clash:
            raise ValueError(f"contract {self.name!r}: {clash} belong to the GEMM path; set `gemm`, not base_engine_env")

    def decode_refusal(self, attention_backend: str) -> str | None:
        """Why `logprob_source=decode` cannot be gated on `attention_backend` under this contract (None: it can).
        The one owner of the rule: the run config (native engines on the sglang kernels) and an SGLang server's
        config ask it, each naming its own keys and fix."""
        if attention_backend in self.decode_equals_extend:
            return None
        return (f"the {attention_backend} backend's decode kernel is not proven to give the bits of its extend "
                "(prefill) kernel (triton's split-KV decode differs on a few tokens on an H200), so the gate, which "
                "compares the sampler's decode-step log-probs with the trainer's prefill recompute, would fail at step 1")

    @property
    def engine_env(self) -> tuple[tuple[str, str], ...]:
        """Every env var both sides pin: the GEMM path's switches, then the rest."""
        return GEMM_PATHS[self.gemm] + self.base_engine_env

    def policy(self, compute):
        """The dtype at every cast of the forward for this compute dtype (top_rl.dtypes.DtypePolicy)."""
        from top_rl.dtypes import DtypePolicy, as_dtype

        return DtypePolicy(compute=as_dtype(compute))

    def describe(self) -> dict:
        """A JSON-able description (dry-run plans, checkpoints, reports)."""
        out = dataclasses.asdict(self)
        out["tiling"] = dataclasses.asdict(self.tiling)
        out["engine_env"] = [list(kv) for kv in self.engine_env]
        if self.gemm == "deepgemm":
            out["deep_gemm"] = dict(DEEPGEMM_SOURCE)
        from top_rl import sglang_release

        known = sglang_release.RELEASES.get(self.sglang_version)  # None: a made-up release (tests)
        out["release"] = known.describe() if known else None
        return out

    @property
    def release(self):
        """The adapter of this contract's SGLang release (top_rl.sglang_release.SglangRelease)."""
        from top_rl import sglang_release

        return sglang_release.get(self.sglang_version)


QWEN3_DENSE_TOP_V1 = TopContract(
    name="qwen3_dense_top_v1",
    sglang_version="0.5.11",
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
    # SGLANG_USE_SGL_FA3_KERNEL: 0.5.11's fa3 backend runs sgl_kernel's FA3 build only while this is on (its
    # default); off, it loads another FA3 build from the Hugging Face Hub (sglang/jit_kernel/flash_attention).
    base_engine_env=(("SGLANG_ENABLE_DETERMINISTIC_INFERENCE", "1"), ("SGLANG_USE_SGL_FA3_KERNEL", "1")),
    # SGLANG_USE_BREAKABLE_CUDA_GRAPH (0.5.11): decode graphs captured as breakable graphs that run eagerly
    forbidden_env=("SGLANG_RETURN_ORIGINAL_LOGPROB", "SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_FALLBACK_VARIANT",
                   "SGLANG_USE_BREAKABLE_CUDA_GRAPH"),
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
    # fa3 (sgl_kernel 0.4.2's FA3, num_splits=1 in deterministic mode, §5): its decode gives its extend's bits on every
    # case of tests/gpu/test_fa3_decode.py against a live 0.5.11 server on an H100 (bench/RESULTS.md session 18).
    decode_equals_extend=("fa3",),
)

# The same contract on DeepGEMM's bf16_gemm_nn: SGLang's own Hopper default, at ~cuBLAS speed. The engine's DeepGEMM
# is sglang-kernel's (DEEPGEMM_SOURCE; 0.4.2's package equals 0.4.1's); measured on the H200 with that package built for torch 2.11
# (scripts/gpu_bundle.sh deep_gemm + scripts/build_deep_gemm.py): batch-invariant at 1..4096 rows
# (tests/gpu/test_deepgemm.py), SGLang's own Qwen3ForCausalLM equal to the trainer layer by layer, logits and
# log-probs (tests/gpu/test_sglang_reference.py), trainer == native engine (docs/numerics.md §11, Question 1). Needs
# an sm90+ GPU and that deep_gemm on both sides; the default stays the Triton GEMM, which runs anywhere.
# decode_equals_extend: empty until fa3's decode is measured with DeepGEMM's GEMMs (a decode step's M is the batch,
# an extend's the tokens: batch-invariant GEMMs make that irrelevant, but this pairing has not run live).
QWEN3_DENSE_TOP_V1_DEEPGEMM = dataclasses.replace(QWEN3_DENSE_TOP_V1, name="qwen3_dense_top_v1_deepgemm",
                                                  gemm="deepgemm", decode_equals_extend=())

# SGLang 0.5.17 (the newest release on torch 2.11): the same dense-Qwen3 contract, read from that wheel's source
# (docs/numerics_0.5.17.md; its release adapter is top_rl/sglang_release.py). Two more flags keep 0.5.11's numerics:
# `--cuda-graph-backend-prefill disabled` (0.5.17 runs prefill under a breakable CUDA graph that deterministic mode
# leaves on, §0.1.1) and `--bf16-gemm-backend torch` (on SM100/SM103 `auto` takes the linear layers off mm_BI, §0.1.2).
# Proven on Hopper GPUs (bench/RESULTS.md sessions 15-16: on an H200 the live-server suite 8/8 and the one-GPU job 20
# steps with abs_diff 0; on an H100 SGLang's own Qwen3 against the trainer layer by layer, 10/10). Only the
# Triton GEMM: 0.5.17's DeepGEMM is another package (sgl-deep-gemm 0.1.5.post1, DEEPGEMM_SOURCE_0_5_17) whose batch
# invariance is unmeasured, so no DeepGEMM contract is offered for it.
ENGINE_FLAGS_OFF_0_5_17 = ENGINE_FLAGS_OFF + (
    # each of these sets the prefill/decode graph backend the contract pins (the parser check catches them as a wrong
    # cuda_graph_backend_*; named here so that the by-name check refuses them too)
    ("--enforce-piecewise-cuda-graph", "a torch.compile piecewise prefill graph replaces the eager prefill"),
    ("--cuda-graph-backend-decode", "the decode graph backend stays SGLang's default (full graphs)"),
    ("--cuda-graph-config", "per-phase CUDA graph settings override the contract's eager prefill"),
    ("--cuda-graph-tc-compiler", "the inductor graph compiler takes another q/k-norm path (numerics.md §4.4)"),
)
QWEN3_DENSE_TOP_V1_SGLANG_0_5_17 = dataclasses.replace(
    QWEN3_DENSE_TOP_V1,
    name="qwen3_dense_top_v1_sglang0517",
    sglang_version="0.5.17",
    engine_flags=QWEN3_DENSE_TOP_V1.engine_flags + ("--cuda-graph-backend-prefill", "disabled",
                                                    "--bf16-gemm-backend", "torch"),
    engine_flags_off=ENGINE_FLAGS_OFF_0_5_17,
    # fa3 (sglang-kernel 0.4.5's FA3, num_splits=1 in deterministic mode as in 0.5.11): its decode gives its extend's
    # bits on every case of tests/gpu/test_fa3_decode.py against a live 0.5.17 server (bench/RESULTS.md session 23).
    decode_equals_extend=("fa3",),
)
# 0.5.17's DeepGEMM (recorded, not offered): the same digest function over sgl-deep-gemm 0.1.5.post1's deep_gemm/
DEEPGEMM_SOURCE_0_5_17 = {
    "package": "sgl-deep-gemm==0.1.5.post1 (deep_gemm)",
    "sources_sha256": "a8650bc957ade07d63b93a995877df46aaab7e192328816320b6ebca3d9f4916",  # numerics_0.5.17.md §0.1.3
}

# What top.contract may choose. Each contract's sglang_version must have a release adapter (top_rl/sglang_release.py).
CONTRACTS = {c.name: c for c in (QWEN3_DENSE_TOP_V1, QWEN3_DENSE_TOP_V1_DEEPGEMM, QWEN3_DENSE_TOP_V1_SGLANG_0_5_17)}
# The contract a release runs where nothing names one (its Triton-GEMM contract): one per release with an adapter.
RELEASE_DEFAULTS = {c.sglang_version: c for c in (QWEN3_DENSE_TOP_V1, QWEN3_DENSE_TOP_V1_SGLANG_0_5_17)}
# The contract where nothing names one. Below the entry layer (cli.py, preflight.py) nothing reads it: every function
# takes the run's contract (top.contract, decided once from the config) as an argument, or the installed KernelPlan's
# in a kernel process, so a second contract that differs is honoured everywhere or refused. The few places that
# must fill in a name when none is given ask `fallback()` (tests/repo/test_contract_argument.py lists them).
DEFAULT = QWEN3_DENSE_TOP_V1


def fallback() -> TopContract:
    """The contract taken where nothing names one: the run config's default (config.TopConfig.contract), a process
    with no KernelPlan installed (a test, a bench: kernels.plan.build), a tool's `contract` argument left out. Never a
    default argument of a function a run calls: those take the run's contract.

    It is the contract of the SGLang release this interpreter imports (RELEASE_DEFAULTS), so a run takes the contract
    that matches the installed release unless top.contract names one; DEFAULT where sglang is not installed (the
    native engine's runs need none). An installed release with no contract also gets DEFAULT, which the SGLang
    engine's version check then refuses before a server starts, naming the releases with a contract."""
    from top_rl import sglang_release

    return RELEASE_DEFAULTS.get(sglang_release.installed_version() or "", DEFAULT)


def for_release(version: str) -> TopContract:
    """The contract SGLang `version` runs where nothing names one; another release is refused, naming the ones with a
    contract."""
    from top_rl import sglang_release

    sglang_release.get(version)  # refuses a release without an adapter
    return RELEASE_DEFAULTS[version]


def with_gemm(top: TopContract, gemm: str) -> list[str]:
    """The names of the contracts for `top`'s SGLang release that run `gemm` (what a refusal of top's GEMM suggests)."""
    return [c.name for c in CONTRACTS.values() if c.sglang_version == top.sglang_version and c.gemm == gemm]


# SGLang turns a temperature <= 1e-6 into greedy decoding with fp32 unscaled log-probs (§6.2): another log-prob kind.
MIN_TEMPERATURE = 1e-6


def temperature_refusal(t) -> str | None:
    """Why TOP cannot sample at temperature `t` (None: it can), as "must be > 1e-6 (...)". The one owner of the
    bound: the run config, SamplingParams, the trainer's sampler path, SGLang sampling settings and the parity
    probe all ask it and name their own key."""
    if t is not None and float(t) > MIN_TEMPERATURE:  # NaN fails too
        return None
    return ("must be > 1e-6 (TOP samples: SGLang turns a lower temperature into greedy decoding, whose fp32 unscaled "
            "log-probs are another kind, §6.2; 1.0 samples the plain policy)")


def get(name: str) -> TopContract:
    try:
        return CONTRACTS[name]
    except KeyError:
        raise ValueError(f"unknown TOP contract {name!r}; known: {sorted(CONTRACTS)}") from None


def __getattr__(name: str):
    # DtypePolicy / as_dtype need torch; they live in top_rl.dtypes (kept reachable here for callers).
    if name in ("DtypePolicy", "as_dtype"):
        from top_rl import dtypes

        return getattr(dtypes, name)
    raise AttributeError(f"module 'top_rl.contract' has no attribute {name!r}")
