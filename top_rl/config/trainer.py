"""The trainer's config, importable without Megatron (the driver and Hydra need it, not the model)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from top_rl.config.model import ComputeDtype


@dataclass
class TrainerConfig:
    dp: int = 1  # data parallel: each replica trains on its share of the batch; world = dp*tp*pp*cp
    tp: int = 1  # tensor parallel degree (divides the heads and widths)
    pp: int = 1  # pipeline parallel degree (divides the layers)
    cp: int = 1  # Ulysses context parallelism (top_rl.train.ulysses)
    micro_batch_size: int | None = 64  # samples per micro-batch, used when micro_batch_tokens is None
    micro_batch_tokens: int | None = None  # packed-token budget per micro-batch
    # Adam learning rate (> 0); the peak of a schedule (top_rl/rl/lr_schedule.py). The tiny CPU job's, measured: 1e-2
    # collapses the tiny policy; 2e-3 learnt on every seed tried, 3e-3 not (a real model's: conf/trainer/gpu.yaml)
    lr: float = 0.002
    lr_schedule: str = "constant"  # after the warm-up: constant | linear | cosine (decay to lr_min)
    lr_warmup_steps: int = 0  # optimizer updates of linear warm-up from lr/warmup to lr (0: none)
    lr_min: float = 0.0  # the floor a linear or cosine decay ends at, in [0, lr]
    # the update where the decay reaches lr_min; null: the run's updates (steps x algo.updates_per_rollout)
    lr_decay_steps: int | None = None
    betas: tuple[float, float] = (0.9, 0.999)  # Adam betas, each in [0, 1)
    eps: float = 1e-8  # Adam epsilon (> 0)
    weight_decay: float = 0.0  # decoupled weight decay (AdamW, >= 0)
    grad_clip: float = 1.0  # 0 disables clipping
    recompute: bool = False  # full recompute of every layer, non-reentrant (top_rl.train.recompute)
    seed: int = 0  # the trainer ranks' torch RNG seed (a resume takes it from the checkpoint)
    # With cluster.gpu_handoff=true only: between steps the fp32 master weights, Adam moments and fp32 gradient buffers
    # wait in pinned host memory (top_rl.train.optim), so the server's KV pool takes most of the GPU while it generates
    offload_during_rollout: bool = False
    megatron_rope: bool = False  # Megatron's unfused RoPE instead of kernels.rope: eager engines only (train/qwen3_megatron.py)

    @property
    def world(self) -> int:
        """Trainer ranks: dp * tp * pp * cp (the one place the product is taken)."""
        return self.dp * self.tp * self.pp * self.cp


@dataclass
class TrainerSettings(TrainerConfig):
    """What a Trainer is built from: the run config's trainer section and the compute dtype, which a run takes from
    model.dtype (one compute dtype for engine and trainer under the TOP contract: the config has no trainer.dtype)."""

    # embedding, norms and residual stream stay fp32 (the contract); None: the model config's torch_dtype
    dtype: ComputeDtype | None = None

    @classmethod
    def of(cls, cfg: TrainerConfig, **changes) -> "TrainerSettings":
        """`cfg`'s fields (a TrainerConfig or TrainerSettings) with `changes`, as TrainerSettings."""
        return cls(**{**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}, **changes})
