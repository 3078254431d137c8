"""The native engine's decode step as a CUDA graph: one replay per step instead of ~20 kernel launches per layer
from Python. Same kernels, same arguments. On the H200 the graph path's tokens and sampler log-probs equal a live
SGLang server's (tests/gpu/test_sglang_live.py, bench/rollout.py); tests/gpu/test_native_decode.py compares graph and
eager steps with torch.equal. The one eager run there that differed by one bf16 step (sessions 7-13) was computed
on the reference kernels, not the engine's (a module fixture set up before the tests' kernel plan; fixed in
tests/gpu/conftest.py); the decode probe under the `sglang` kernels found eager, graph and alone calls equal.

Only where the decode step was audited to make no host read and to allocate no host-filled tensor: the `sglang`
kernel backend with triton attention (mm_BI, mean_BI, the Triton RMSNorm / SiLU passes, the compiled RoPE, lsm_BI,
SGLang's decode kernel with device-built kv indices, SGLang's murmur hash and the float64 Gumbel step). flashinfer
plans each batch from the lengths on the host, and the reference kernels loop over key blocks on the host: their
steps run eagerly. top.fast_paths.decode_graphs=false turns graphs off (A/B measurements).

One graph per generate call, captured at its second decode step (the first runs eagerly: every kernel is compiled
and every lazy import done before capture) and dropped at the end of the call: nothing outlives the call's KV
cache and weights. Should a capture fail, the step runs eagerly from then on in this process, after one warning.
"""

from __future__ import annotations

import warnings

import torch

from top_rl.kernels import fallback

_failed: list[str] = []  # the first capture error in this process


def audited_path() -> bool:
    from top_rl import kernels

    plan = kernels.current_plan()
    return plan.backend == "sglang" and plan.attention == "triton"


def wanted(device, requested: bool | None = None) -> bool:
    """Whether a generate call on `device` captures its decode step: `requested` (the engine's cuda_graphs) if
    given, else CUDA, the audited kernels and the plan's decode_graphs switch; never after a failed capture."""
    if torch.device(device).type != "cuda" or _failed:
        return False
    if requested is not None:
        return requested
    from top_rl import kernels

    return kernels.current_plan().fast_paths.decode_graphs and audited_path()


class StepRunner:
    """Runs `state.step()`: eagerly, or (with `graphs`) eagerly once, then as a captured CUDA graph."""

    def __init__(self, state, graphs: bool):
        self.state, self.graphs = state, graphs
        self.graph: torch.cuda.CUDAGraph | None = None
        self.eager_steps = 0

    def step(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            return
        if self.graphs and self.eager_steps >= 1 and not _failed:
            self.graph = self._capture()
            if self.graph is not None:
                self.graph.replay()
                return
        self.state.step()
        self.eager_steps += 1

    def _capture(self) -> torch.cuda.CUDAGraph | None:
        """The step captured (not run: the state is as before), or None after a failure (warned once)."""
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: another thread's CUDA calls (Ray's, a logger's) cannot invalidate this capture
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.state.step()
            return graph
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - any capture failure: the eager step computes the same
            _failed.append(fallback.error_line(e))
            fallback.fell_back("decode_graph", _failed[0])
            warnings.warn(f"CUDA graph capture of the native engine's decode step failed ({_failed[0]}); decode steps "
                          "run eagerly from now on", RuntimeWarning, stacklevel=3)
            torch.cuda.synchronize()
            return None

    def close(self) -> None:
        self.graph = None  # frees the graph's memory pool with the call's other tensors
