"""The `sglang` kernel backend: SGLang 0.5.11's own kernels in the forward, analytic backwards (GPU only).

  backend.py            the backend module the seam installs (every op); mm_BI, mean_BI, lsm_BI, the compiled RoPE
  engine_env.py         the contract's engine environment pinned before SGLang loads (its GEMM path), and checked
  attention.py          the engine's attention kernel forward (triton, fa3; attention_flashinfer.py: flashinfer)
  attention_backward.py aten's varlen flash / memory-efficient backward, fed flashinfer's LSE where it has one
  fused_forward.py      RMSNorm, SiLU-and-mul, token log-prob forwards: eager chains or one Triton pass each
                        (fused_triton.py, logprob_triton.py), the same bits
  backward.py           the elementwise backwards compiled or as Triton passes (swiglu_grad_triton.py)
  deep_gemm_source.py   the digest that ties a process's DeepGEMM to the engine's (contract)
Which of the fast paths run is the installed KernelPlan's (top_rl/kernels/plan.py), never the environment's.
"""
