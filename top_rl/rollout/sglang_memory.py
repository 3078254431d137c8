"""Whether SGLang servers and a trainer rank fit on one GPU when they share it (cluster.colocate=true).

An SGLang server takes `mem_fraction_static` of the GPU's memory for its weights and KV pool at start and leaves
the rest free for what it allocates per batch (sglang/srt/model_executor/model_runner.py, profile_max_num_token:
the KV pool is sized so that `total * (1 - mem_fraction_static)` stays free). The trainer rank on the same GPU must
fit in that rest, beside the servers' per-batch memory: a prefill that returns log-probs computes the logits of a
whole chunk (`chunked_prefill_size` tokens x vocab). The estimate below counts what cannot be avoided (weights,
fp32 master weights and gradients, Adam's two moments, one micro-batch's logits and activations) and is meant to
refuse a layout that cannot work, naming the numbers, before any GPU is touched; it is not a tight bound.

With cluster.gpu_handoff the GPU is shared in time: the servers give back their memory while the trainer steps, and
the trainer empties its cache before they take it again, so the two phases must each fit: the rollout (the servers'
memory beside what the trainer keeps between steps: weights, master weights, gradients, Adam) and the step (the
whole trainer beside each server's CUDA context). With trainer.offload_during_rollout the trainer parks its fp32 master
weights, Adam moments and fp32 gradients in host memory between steps (top_rl.train.optim), so the rollout phase counts
only its weights beside the servers (OFFLOADED_RESIDENT_BYTES_PER_PARAM).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
CUDA_CONTEXT_BYTES = 1 * GIB  # per process on the GPU (the trainer rank, each server's scheduler)
SGLANG_DEFAULT_CHUNK = 8192  # chunked_prefill_size SGLang picks on a large GPU when none is given
# What a trainer rank holds between steps, per parameter, after torch.cuda.empty_cache(): measured on an H200 for the
# Qwen3-0.6B shape (596,049,920 parameters) in the GSM8K job (perf/trainer/gpu_resident_gib): 10.7 GiB after step 1
# (weights, master weights, gradients, Adam: ~18 B a parameter), then 31.9-35.2 GiB after steps 2-4, of which 26-30 GiB
# live tensors (perf/trainer/gpu_allocated_gib; what holds the extra ~20 GiB is not found yet: a CPU run of the same
# steps keeps none). The estimate takes the largest seen, so a layout that ran out of memory there is refused here.
RESIDENT_BYTES_PER_PARAM = 64  # 35.2 GiB / 596,049,920 parameters = 63.4
# What stays between steps with trainer.offload_during_rollout: the model's weights (2 B a parameter in the compute
# dtype, 4 for the fp32 embedding and norms; counted at 4 B for every parameter) and what the step leaves allocated that
# is not a parameter's. Measured on an H200 for the Qwen3-4B shape (4,022,468,096 parameters, micro_batch_tokens=16384,
# the GSM8K job, bench/RESULTS.md session 14): 18.1 GiB allocated after steps 2-3 (perf/trainer/gpu_allocated_gib)
# against 15.0 GiB of weights. The rest is counted as one micro-batch's fp32 logits (micro_batch_tokens x vocab x 4 B,
# 9.3 GiB there: STEP_LEFTOVER_BYTES_PER_LOGIT), which covers that measurement (24.3 GiB >= 18.1); not yet measured for
# other shapes.
OFFLOADED_RESIDENT_BYTES_PER_PARAM = 4
STEP_LEFTOVER_BYTES_PER_LOGIT = 4

def param_count(arch) -> int:
    """Parameters of a dense Qwen3-shaped config (embedding, lm_head unless tied, layers, final norm)."""
    h, i, layers = arch.hidden_size, arch.intermediate_size, arch.num_hidden_layers
    per_layer = h * (arch.q_size + 2 * arch.kv_size) + arch.q_size * h + 3 * h * i + 2 * h + 2 * arch.head_dim
    embed = arch.vocab_size * h * (1 if arch.tie_word_embeddings else 2)
    return embed + layers * per_layer + h


@dataclass(frozen=True)
class SharedGpuEstimate:
    gpu_bytes: int
    server_static_bytes: int  # mem_fraction_static x GPU, per server
    servers: int
    server_dynamic_bytes: int  # per server: one prefill chunk's logits
    trainer_bytes: int
    trainer_resident_bytes: int = 0  # what the trainer keeps between steps (weights, master copy, grads, Adam)
    handoff: bool = False  # cluster.gpu_handoff (module doc)
    offload: bool = False  # trainer.offload_during_rollout: trainer_resident_bytes is its weights only (module doc)

    @property
    def servers_bytes(self) -> int:
        return self.servers * (self.server_static_bytes + self.server_dynamic_bytes + CUDA_CONTEXT_BYTES)

    @property
    def needed(self) -> int:
        if self.handoff:  # the larger of the two phases
            return max(self.servers_bytes + self.trainer_resident_bytes,
                       self.servers * CUDA_CONTEXT_BYTES + self.trainer_bytes) + CUDA_CONTEXT_BYTES
        return self.servers_bytes + self.trainer_bytes + CUDA_CONTEXT_BYTES

    def best_fraction(self) -> float:
        """The largest mem_fraction_static at which this layout fits."""
        rest = self.trainer_resident_bytes if self.handoff else self.trainer_bytes
        room = self.gpu_bytes - rest - CUDA_CONTEXT_BYTES - self.servers * (self.server_dynamic_bytes + CUDA_CONTEXT_BYTES)
        return room / (self.servers * self.gpu_bytes)

    def describe(self) -> str:
        g = lambda b: f"{b / GIB:.1f} GiB"  # noqa: E731
        servers = (f"{self.servers} SGLang server(s) x ({g(self.server_static_bytes)} static + "
                   f"{g(self.server_dynamic_bytes)} per prefill chunk)")
        if self.handoff:
            kept = " (optimizer state and gradients offloaded: trainer.offload_during_rollout)" if self.offload else ""
            return (f"rollout: {servers} + the trainer's resident ~{g(self.trainer_resident_bytes)}{kept}; step: the trainer "
                    f"rank ~{g(self.trainer_bytes)}; with CUDA contexts the larger needs {g(self.needed)} of the GPU's "
                    f"{g(self.gpu_bytes)}")
        return f"{servers} + the trainer rank ~{g(self.trainer_bytes)} + CUDA contexts = {g(self.needed)} of the GPU's " \
               f"{g(self.gpu_bytes)}"


def trainer_bytes(arch, micro_batch_tokens: int, recompute: bool) -> int:
    """Weights (compute dtype, 2 B) + fp32 master weights, gradients and Adam moments (16 B) per parameter, one
    micro-batch's logits (bf16 forward and its gradient) and activations (full recompute keeps each layer's fp32
    residual input and one layer's working set; without it every layer's)."""
    n = param_count(arch)
    t, h, i = micro_batch_tokens, arch.hidden_size, arch.intermediate_size
    logits = t * arch.vocab_size * 4
    layer_working = t * (6 * h + 2 * (arch.q_size + 2 * arch.kv_size) + 6 * i) * 2
    acts = arch.num_hidden_layers * t * h * 4 + layer_working if recompute else arch.num_hidden_layers * layer_working
    return 18 * n + logits + acts


def estimate(arch, micro_batch_tokens: int, recompute: bool, mem_fraction_static: float, servers: int,
             gpu_bytes: int, chunked_prefill_size: int = SGLANG_DEFAULT_CHUNK, handoff: bool = False,
             offload: bool = False) -> SharedGpuEstimate:
    """`offload`: trainer.offload_during_rollout (with `handoff` only; config.validate refuses it otherwise)."""
    offload = offload and handoff
    if offload:  # the weights and the step's leftovers between steps; the step by the formula (module doc)
        resident = offloaded_resident_bytes(arch, micro_batch_tokens)
        step = trainer_bytes(arch, micro_batch_tokens, recompute)
    else:
        resident = RESIDENT_BYTES_PER_PARAM * param_count(arch)
        # A step never holds less than what stays after it (measured above the formula's step: see RESIDENT_BYTES_PER_PARAM)
        step = max(trainer_bytes(arch, micro_batch_tokens, recompute), resident)
    return SharedGpuEstimate(gpu_bytes=gpu_bytes, server_static_bytes=int(mem_fraction_static * gpu_bytes),
                             servers=servers, server_dynamic_bytes=chunked_prefill_size * arch.vocab_size * 6,
                             trainer_bytes=step, trainer_resident_bytes=resident, handoff=handoff, offload=offload)


def offloaded_resident_bytes(arch, micro_batch_tokens: int) -> int:
    """What a trainer rank keeps on the GPU between steps with trainer.offload_during_rollout (the constants above)."""
    return OFFLOADED_RESIDENT_BYTES_PER_PARAM * param_count(arch) + STEP_LEFTOVER_BYTES_PER_LOGIT * micro_batch_tokens * \
        arch.vocab_size


def weights_bytes(arch) -> int:
    """The server's copy of the model (bf16: 2 B a parameter)."""
    return 2 * param_count(arch)


def kv_bytes_per_token(arch) -> int:
    """One token's K and V in every layer of the server's KV pool (bf16, SGLang's kv_cache_dtype=auto for a bf16
    model): layers x 2 x kv_heads x head_dim x 2 B (112 KiB for Qwen3-0.6B, 144 KiB for Qwen3-4B)."""
    return arch.num_hidden_layers * 2 * arch.kv_size * 2
