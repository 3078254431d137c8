"""Test doubles, named as such: nothing in the product imports this package.

- `sgl_kernel_standin`: an `sgl_kernel` module whose every function raises when called, so SGLang's own
  Python code (its request dataclasses, its Qwen3 model in rl mode) imports where sglang-kernel is absent,
  and any call into the missing kernels fails naming the function.
- `sglang_standin`: a STAND-IN SGLang server: SGLang 0.5.11's own HTTP app and tokenizer manager
  in front of a stand-in scheduler that computes with TOP-RL's model (`python -m tests.doubles.sglang_standin`).
"""
