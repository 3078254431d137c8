"""SGLang 0.5.17: the newest release on torch 2.11; what it moves against 0.5.11 is docs/numerics_0.5.17.md."""

from top_rl.sglang_release.base import SglangRelease

RELEASE = SglangRelease(
    version="0.5.17",
    status="proven",  # bench/RESULTS.md sessions 15 and 16
    numerics_doc="docs/numerics_0.5.17.md",
    # numerics_0.5.17.md §0.3.1: triton_ops/ is gone, the kernels moved under sglang.kernels.ops.attention
    triton_extend_module="sglang.kernels.ops.attention.extend_attention",
    triton_decode_module="sglang.kernels.ops.attention.decode_attention",
    murmur_hash_file="kernels/ops/sampling/murmur_hash.py",  # §0.3.2 (identical text)
    fla_logger="sglang.kernels.ops.attention.fla.utils",  # §0.3.3
    retractions_key="num_retractions",  # §0.4
    # §0.2: the fields carry the long names as aliases; --cuda-graph-max-bs is a deprecated alias
    argv_dests={"tensor_parallel_size": "tp_size", "pipeline_parallel_size": "pp_size",
                "data_parallel_size": "dp_size", "cuda_graph_max_bs": "cuda_graph_max_bs_decode"},
    # §0.1.1: eager prefill (the breakable prefill graph deterministic mode leaves on is off), §0.1.2: linear layers on
    # F.linear (mm_BI) on every GPU, and no per-phase graph override or torch.compile graph compiler
    argv_pinned={"cuda_graph_backend_prefill": "disabled", "bf16_gemm_backend": "torch",
                 "cuda_graph_backend_decode": None, "cuda_graph_config": None, "cuda_graph_tc_compiler": None},
    cuda_graph_max_bs_flag="--cuda-graph-max-bs-decode",
    cpu_extra_requirements=("xgrammar==0.2.1", "apache-tvm-ffi==0.1.11"),  # §0.3.5
    cpu_imports_sgl_kernel=True,  # §0.3.5 (sglang/kernels/ops/kvcache/cache_move.py:7-10 when is_cpu())
    global_args="runtime_context",  # §0.3.4
    gpu_pins=(("torch", "2.11.0"), ("sglang-kernel", "0.4.5"), ("flashinfer-python", "0.6.15.post1"),
              ("transformers", "5.12.1")),
)
