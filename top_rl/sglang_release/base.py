"""The adapter type: what one SGLang release names differently (top_rl/sglang_release/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SglangRelease:
    version: str
    # "proven": the contract's bitwise claims were measured on a GPU with this release; "built": the contract is read
    # from the wheel's source (docs/numerics_<v>.md) and its CPU tests pass, no GPU proof yet.
    status: str
    numerics_doc: str
    # The engine's Triton attention kernels the trainer calls (top_rl/kernels/sglang/attention.py)
    triton_extend_module: str
    triton_decode_module: str
    # SGLang's Triton murmur_hash32, loaded by file (top_rl/rollout/native/seeded_sampler.py), relative to sglang/
    murmur_hash_file: str
    # The logger of the Triton-availability warning SGLang's parser import logs on a CPU host (top_rl/observe/quiet.py)
    fla_logger: str
    # The request's retraction count in /generate meta_info (top_rl/rollout/sglang/protocol.py)
    retractions_key: str
    # TOP-RL's name for a parsed server setting -> the argparse dest of this release's parser (rollout/sglang/launch.py)
    argv_dests: dict[str, str] = field(default_factory=dict)
    # Parsed settings the contract pins beyond the config's own (dest -> value), checked on every TOP command
    argv_pinned: dict[str, object] = field(default_factory=dict)
    cuda_graph_max_bs_flag: str = "--cuda-graph-max-bs"
    # CPU: packages `import sglang.srt.server_args` needs beyond 0.5.11's (requirements/sglang-cpu.txt)
    cpu_extra_requirements: tuple[str, ...] = ()
    # CPU: whether io_struct / schedule_batch / sampler import sgl_kernel on a CPU host (tests stand it in)
    cpu_imports_sgl_kernel: bool = False
    # tests/sglang_cpu.py: how the process-global ServerArgs is published and restored
    global_args: str = "module_global"  # "module_global" (server_args._global_server_args) | "runtime_context"
    # The GPU stack this release's wheel pins (its METADATA's Requires-Dist, requirements/sglang-<v>-requires-dist.txt):
    # the trainer imports the engine's kernels, so it must run these exact builds. `top-rl doctor` checks them, the
    # pyproject extra sglang<v> installs them (tests/repo/test_gpu_install.py keeps the three equal).
    gpu_pins: tuple[tuple[str, str], ...] = ()
    # GPU architectures (compute capability) the contract was proven on; others >= sm80 run but are unproven
    proven_archs: tuple[str, ...] = ("sm90",)

    def dest(self, name: str) -> str:
        """This release's argparse dest for TOP-RL's setting `name` (the same name where nothing moved)."""
        return self.argv_dests.get(name, name)

    def describe(self) -> dict:
        return {"sglang": self.version, "status": self.status, "numerics": self.numerics_doc}
