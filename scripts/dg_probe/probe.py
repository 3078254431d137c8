"""One DeepGEMM bf16 GEMM after installing segv_trace.so's SIGSEGV handler (argv[1]); run by run.sh."""
import ctypes, os, sys
lib = ctypes.CDLL(sys.argv[1])
import torch, deep_gemm
print("deep_gemm", deep_gemm.__file__, flush=True)
print("arch", torch.cuda.get_device_capability(), "sms", deep_gemm.get_num_sms(), flush=True)
lib.install()
a = torch.randn(256, 1024, device="cuda").bfloat16()
w = torch.randn(1024, 1024, device="cuda").bfloat16()
out = torch.empty(256, 1024, device="cuda", dtype=torch.bfloat16)
print("calling bf16_gemm_nt", flush=True)
deep_gemm.bf16_gemm_nt(a, w, out)
torch.cuda.synchronize()
ref = a.float() @ w.float().t()
print("OK max err", (out.float() - ref).abs().max().item(), flush=True)
