"""bench/rl_step_compare.py's settings: the two top-rl jobs (one typed Job each), the table's columns (one typed
Side each, from `sides()`) and the parts a step is cut into."""

from __future__ import annotations

from dataclasses import dataclass

# Both jobs are the shipped one-GPU GSM8K recipe (64 prompts x 8 samples, the GPU handed between server and trainer,
# CUDA graphs and running requests up to the whole batch, the server's share sized for the card: `auto`) on a random
# Qwen3-0.6B shape, without checkpoints
JOB = ["+experiment=gsm8k_qwen3_0.6b_one_gpu", "model.path=null", "checkpoint.every=0", "tracking.wandb_mode=disabled",
       "tracking.console=true"]


# SGLang 0.5.11's default mode with fa3 dies at start-up while capturing its piecewise (prefill) CUDA graphs: "illegal
# memory access", reported by the next kernel (sgl_kernel's fused_add_rmsnorm), with the inductor compiler and with
# --piecewise-cuda-graph-compiler eager alike (an H100, 2026-12-07). The TOP contract's deterministic mode runs fa3 in
# the same graphs without it. The likely cause (not yet confirmed on a GPU): the default mode leaves FA3's split count
# to its heuristic (flashattention_backend.py: num_splits = 0 unless deterministic inference, where it is 1), and a
# graph captured with one split count and replayed where the heuristic picks more writes past the split buffers: the
# illegal memory access vLLM fixed by fixing num_splits at capture and replay (vllm-project/vllm#20301); SGLang's own
# FA3 num_splits=0 graph-capture failure is sgl-project/sglang#22800. With the piecewise graphs off (decode CUDA graphs
# stay on) the default mode runs, so the non-TOP server on fa3 turns them off and the table says so.
NO_PIECEWISE = "rollout.sglang.extra_args=[--disable-piecewise-cuda-graph]"


@dataclass(frozen=True)
class Job:
    """One top-rl run of the compare: the server's mode and the trainer's kernels, as top-rl overrides."""

    name: str
    top: bool  # the TOP contract on both sides; False: `top.enabled=false`, SGLang's default mode and `stock` kernels
    attention_backend: str  # the server's --attention-backend (auto: the shipped choice for the GPU)
    logprob_source: str  # auto | decode | prefill: which log-probs the rollout returns
    radix_cache: bool
    old_logprob_forward: bool  # algo.old_logprobs=recompute: a forward of the batch before the update

    def overrides(self) -> list[str]:
        return ([] if self.top else ["top.enabled=false"]) + [
            f"top.attention_backend={self.attention_backend}", f"rollout.logprob_source={self.logprob_source}",
            f"rollout.sglang.disable_radix_cache={str(not self.radix_cache).lower()}",
            f"algo.old_logprobs={'recompute' if self.old_logprob_forward else 'rollout'}"] + (
            [NO_PIECEWISE] if not self.top and self.attention_backend == "fa3" else [])

    @property
    def slug(self) -> str:
        return self.name.replace(" ", "_")


@dataclass(frozen=True)
class Side:
    """One column of the table: a job's rollout, weight sync and the rest of its step, with a trainer."""

    name: str
    job: Job
    trainer: str  # "job": the job's own trainer; "megatron_gpt": bench/_stock_gpt.py's, timed on the job's batch
    old_logprob_forward: bool  # whether the column pays the old-log-prob forward


TOP = Job("TOP", top=True, attention_backend="auto", logprob_source="auto", radix_cache=False,
          old_logprob_forward=False)
NON_TOP = Job("non-TOP", top=False, attention_backend="fa3", logprob_source="decode", radix_cache=True,
              old_logprob_forward=True)


def sides(non_top: Job = NON_TOP) -> list[Side]:
    """The table's columns: TOP, then the non-TOP job with each trainer, with and without the old-log-prob forward."""
    return [Side("TOP", TOP, "job", False),
            Side("non-TOP, Qwen3 stock, + old-lp fwd", non_top, "job", True),
            Side("non-TOP, Qwen3 stock", non_top, "job", False),
            Side("non-TOP, Megatron GPT, + old-lp fwd", non_top, "megatron_gpt", True),
            Side("non-TOP, Megatron GPT", non_top, "megatron_gpt", False)]


PARTS = ("rollout (generate)", "old-log-prob forward", "train fwd+bwd+optim", "weight sync", "other")
TRAIN_KEYS = ("perf/trainer/forward_backward_s", "perf/trainer/gate_s", "perf/trainer/optimizer_s")
