"""Import the installed SGLang wheel (one with a TOP contract) on CPU and give its layers the global state they read.

The tests run against whichever release is importable: 0.5.11 from the venv, or 0.5.17 from a `--target` dir on
PYTHONPATH (scripts/install_sglang_cpu.sh --release 0.5.17 --target DIR; .ci/run runs the SGLang tests again so).
`SGLANG_VERSION` is that release, `RELEASE` its adapter (top_rl/sglang_release/), `CONTRACT` its default contract.

SGLang's layers read a process-global `ServerArgs` (`get_global_server_args()`); in rl mode
(`rl_on_policy_target="fsdp"`) `RotaryEmbedding` / `SiluAndMul` dispatch to `forward_native` and RoPE
wraps `apply_rotary_emb` in `torch.compile(dynamic=True)`. A real `ServerArgs(...)` cannot be built here:
its `__post_init__` loads the model's HF config (network) and probes the GPU. So `server_args()` fills
every dataclass field with its declared default, sets the rl-mode fields, and skips `__post_init__`.

CPU specifics (none of them changes the math of the ops compared):
- `SGLANG_USE_CPU_ENGINE=1` must be set before sglang is imported: `rotary_embedding/base.py` decides at
  import whether it is on CPU; otherwise a non-CUDA host takes the `vllm._custom_ops` fallback branch.
- rl mode computes RoPE's inv_freq on CPU and then calls `inv_freq.cuda()` (base.py `_compute_inv_freq`).
  With no GPU, `rl_mode()` makes `Tensor.cuda` return the tensor unchanged while SGLang layers are built;
  the whole cache is therefore computed on CPU (on a GPU SGLang computes t, the einsum and cos/sin on CUDA).
- off CUDA, `RotaryEmbedding.__init__` casts the cache to its `dtype` argument: pass fp32 to keep the
  fp32 cache SGLang keeps on CUDA.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

from top_rl import contract as _contract  # noqa: E402
from top_rl import sglang_release as _releases  # noqa: E402

# The SGLang-specific tests CI runs once per release with a contract (.ci/run: the whole suite under the venv's 0.5.11,
# then these again with 0.5.17 on PYTHONPATH): SGLang's flag parser, its seeded sampler, its torch-native ops, the
# stand-in server on SGLang's own HTTP app, TokenizerManager and request structs (in-thread and as a launched process),
# the parity probe against it, SGLang's own Qwen3 built on CPU, and the trainer's seam to its Triton attention. (The whole loop on the stand-in,
# tests/entry/test_loop_sglang_standin.py, runs under 0.5.11 only: it adds minutes and no release-specific code.)
PER_RELEASE_TESTS = (
    "tests/repo/test_sglang_release.py",
    "tests/kernels/test_contract_engine_flags.py",
    "tests/rollout/test_sglang_launch.py",
    "tests/rollout/test_seeded_sampler.py",
    "tests/kernels/test_sglang_native_ops.py",
    "tests/rollout/test_sglang_standin_protocol.py",
    "tests/rollout/test_sglang_engine.py",
    "tests/rollout/test_sglang_engine_refusals.py",  # each refusal under the installed release's contract
    "tests/rollout/test_sglang_engine_weights.py",
    "tests/rollout/test_sglang_engine_process.py",
    "tests/rollout/test_sglang_reference_build.py",
    "tests/tools/test_parity_probe.py",
    "tests/kernels/test_attention_selector.py",  # the trainer's call of SGLang's Triton attention (moved in 0.5.17)
)

CONTRACT = _contract.fallback()  # the installed release's contract (0.5.11's where none, or another, is installed)
SGLANG_VERSION = CONTRACT.sglang_version  # the release the tests run against
RELEASE = _releases.get(SGLANG_VERSION)


def import_error() -> str | None:
    """None when the pinned sglang and the layers the tests use import; else why not."""
    try:
        import sglang
        import sglang.srt.layers.activation  # noqa: F401
        import sglang.srt.layers.layernorm  # noqa: F401
        import sglang.srt.layers.rotary_embedding  # noqa: F401
        import sglang.srt.server_args  # noqa: F401
        import fastapi, msgspec, uvicorn  # noqa: F401,E401  (the stand-in server runs SGLang's own HTTP app)
    except Exception as e:  # ImportError, or an import-time failure of a missing light dependency
        return f"sglang not importable ({type(e).__name__}: {e}); run scripts/install_sglang_cpu.sh"
    if sglang.__version__ != SGLANG_VERSION:
        return (f"sglang {sglang.__version__} installed, which has no TOP contract (the releases with one: "
                f"{_releases.supported()})")
    return None


def server_args(**overrides):
    """A ServerArgs holding every field's default plus `overrides`, without running __post_init__."""
    from sglang.srt.server_args import ServerArgs

    sa = object.__new__(ServerArgs)
    for f in dataclasses.fields(ServerArgs):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = None
        object.__setattr__(sa, f.name, value)
    for k, v in overrides.items():
        if not hasattr(sa, k):
            raise AttributeError(f"ServerArgs has no field {k!r}")
        object.__setattr__(sa, k, v)
    return sa


@contextlib.contextmanager
def cpu_imports():
    """While SGLang modules are imported: the sgl_kernel stand-in where the release imports sgl_kernel on a CPU host
    (0.5.17: io_struct, schedule_batch, layers.sampler; tests/doubles/sgl_kernel_standin.py), else nothing."""
    if not RELEASE.cpu_imports_sgl_kernel:
        yield
        return
    from tests.doubles import sgl_kernel_standin

    with sgl_kernel_standin.installed():
        yield


RL_MODE = dict(model_path="x", rl_on_policy_target="fsdp", enable_deterministic_inference=True,
               disable_radix_cache=True, dtype="bfloat16", device="cpu")


@contextlib.contextmanager
def rl_mode(**overrides):
    """Install rl-mode global ServerArgs (restoring the previous ones after) and, while no GPU is
    present, let `Tensor.cuda()` be the identity so rl-mode RoPE can be built on CPU."""
    import torch
    from sglang.srt import server_args as sa_mod

    restore = _global_args_restorer(sa_mod)
    sa_mod.set_global_server_args_for_scheduler(server_args(**{**RL_MODE, **overrides}))
    orig_cuda = torch.Tensor.cuda
    if not torch.cuda.is_available():
        torch.Tensor.cuda = lambda self, *a, **k: self
    try:
        yield sa_mod.get_global_server_args()
    finally:
        torch.Tensor.cuda = orig_cuda
        restore()


def _global_args_restorer(sa_mod):
    """A function putting back the process-global ServerArgs as they are now. 0.5.11 keeps them in
    server_args._global_server_args; 0.5.17 in sglang.srt.runtime_context, whose layers read snapshots ("config bags")
    taken at publish, so the whole published state is put back."""
    if RELEASE.global_args == "module_global":
        prev = sa_mod._global_server_args
        return lambda: setattr(sa_mod, "_global_server_args", prev)
    from sglang.srt import runtime_context

    ctx = runtime_context.get_context()
    names = ("_server_args", "_config_bags", "_overrides_log", "_publish_role")
    prev = {n: getattr(ctx, n) for n in names}
    return lambda: [setattr(ctx, n, v) for n, v in prev.items()]
