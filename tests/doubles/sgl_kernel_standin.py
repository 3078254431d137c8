"""A stand-in `sgl_kernel` (sglang-kernel's Python package) whose every function raises when called.

sglang-kernel is a ~330 MB CUDA build (0.4.2: torch 2.11): it installs neither on CPU nor, whole, on the lent
GPU. SGLang's Python modules import names from it at module level (`from sgl_kernel.kvcacheio import ...`),
but SGLang's rl-mode prefill, sampler and decode step call none of them (measured on an H200 with this
module). So `install()` answers every `import sgl_kernel[.sub]` with a module whose attributes are
callables that raise `SglKernelCalled` naming the function, and records the call in `CALLS`: a test
that must not touch sgl_kernel checks `CALLS == []` and names the first function otherwise.
Attribute chains (`scalar_types.uint4b8`) resolve to further stand-ins, so import-time constants work.
A real sgl_kernel, when installed, is never shadowed: `install()` then does nothing and returns False.
On CUDA, SGLang also registers fake (meta) kernels for a few `sgl_kernel::` torch ops at import
(`torch.library.register_fake("sgl_kernel::moe_fused_gate")` in sglang/srt/layers/moe/topk.py, imported by
every model); that needs the op's schema to exist, so `install()` defines those ops too, with CPU and CUDA
kernels that raise like every other stand-in (measured on the H200: without them the model registry skips
qwen3 with "operator sgl_kernel::moe_fused_gate does not exist").
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

CALLS: list[str] = []  # every stand-in function called, in order ("sgl_kernel.flash_attn.flash_attn_with_kvcache")


class SglKernelCalled(RuntimeError):
    """SGLang called a function of the absent sglang-kernel."""


class _Stub:
    """A name inside the stand-in: calling it raises, reading an attribute gives a deeper stub."""

    def __init__(self, path: str):
        self._path = path

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stub(f"{self._path}.{name}")

    def __call__(self, *args, **kwargs):
        CALLS.append(self._path)
        raise SglKernelCalled(f"{self._path}() was called, but sgl_kernel is a stand-in here (sglang-kernel is "
                              f"not installed): this code path needs a kernel the test promised not to use")

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in {self._path}>"


class _Module(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        stub = _Stub(f"{self.__name__}.{name}")
        setattr(self, name, stub)
        return stub


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "sgl_kernel" or fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+standin"
        module.STANDIN = True
        return module

    def exec_module(self, module):
        pass


_FINDER = _Finder()


def real_sgl_kernel_installed() -> bool:
    if any(f is _FINDER for f in sys.meta_path):
        return False
    return importlib.util.find_spec("sgl_kernel") is not None


# sgl_kernel torch ops SGLang registers fakes for at import on CUDA (op name -> schema after the name).
TORCH_OPS = {
    "moe_fused_gate": "(Tensor input_tensor, Tensor bias, int num_expert_group, int topk_group, int topk, "
                      "int num_fused_shared_experts=0, float routed_scaling_factor=0, "
                      "bool apply_routed_scaling_factor_on_output=False) -> Tensor[]",
}
_LIBRARY = None


def _define_torch_ops() -> None:
    global _LIBRARY
    import torch

    if _LIBRARY is not None:
        return
    missing = [n for n in TORCH_OPS if not hasattr(torch.ops.sgl_kernel, n)]
    if not missing:
        return
    _LIBRARY = torch.library.Library("sgl_kernel", "FRAGMENT")
    for name in missing:
        _LIBRARY.define(name + TORCH_OPS[name])
        stub = _Stub(f"sgl_kernel.{name}")
        for key in ("CPU", "CUDA"):
            _LIBRARY.impl(name, lambda *a, _stub=stub, **k: _stub(*a, **k), key)


def install() -> bool:
    """Answer `import sgl_kernel...` with the stand-in (process-wide). False if the real one is installed."""
    if any(f is _FINDER for f in sys.meta_path):
        return True
    if real_sgl_kernel_installed():
        return False
    sys.meta_path.insert(0, _FINDER)
    _define_torch_ops()
    return True


def uninstall() -> None:
    """Stop answering new imports; modules that already imported stand-in names keep them (they still raise)."""
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n, m in sys.modules.items() if isinstance(m, _Module)]:
        del sys.modules[name]


@contextlib.contextmanager
def installed():
    """The stand-in only while the block imports SGLang modules; `import sgl_kernel` fails again after it,
    so code that probes for the real package (e.g. the fa3 attention backend) is not fooled."""
    already = any(f is _FINDER for f in sys.meta_path)
    added = install() and not already
    try:
        yield
    finally:
        if added:
            uninstall()
