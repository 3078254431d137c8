"""The native engine: in-process batched generation over the kernel seam (the embedded default).

  engine.py          NativeEngine: prefill, the on-device decode loop, re-scoring, and the weight protocol's
                     named-tensor load (top_rl/engine/interface.py)
  decode_graph.py    one decode step as a CUDA graph, or launched op by op
  seeded_sampler.py  SGLang's rl-mode sampler: Gumbel-max over the sampler's log-probs, noise hashed from
                     (sampling seed, position, token id)
"""
