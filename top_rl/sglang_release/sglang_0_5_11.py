"""SGLang 0.5.11: the release the first contract is read from and proven with (docs/numerics.md)."""

from top_rl.sglang_release.base import SglangRelease

RELEASE = SglangRelease(
    version="0.5.11",
    status="proven",
    numerics_doc="docs/numerics.md",
    triton_extend_module="sglang.srt.layers.attention.triton_ops.extend_attention",
    triton_decode_module="sglang.srt.layers.attention.triton_ops.decode_attention",
    murmur_hash_file="srt/layers/utils/hash.py",
    fla_logger="sglang.srt.layers.attention.fla.utils",
    retractions_key="total_retractions",
    # 0.5.11: the inductor piecewise compiler takes another q/k-norm path (numerics.md §4.4)
    argv_pinned={"piecewise_cuda_graph_compiler": "eager"},
    gpu_pins=(("torch", "2.11.0"), ("sglang-kernel", "0.4.2"), ("flashinfer-python", "0.6.8.post1"),
              ("flashinfer-cubin", "0.6.8.post1"), ("transformers", "5.6.0")),
)
