"""Optimizers behind one small interface: plain torch AdamW on CPU, Megatron's optimizer on GPU.

Gradient semantics (both): a step's gradient is the SUM over micro-batches and over data/context-
parallel ranks of d loss_fn / d params; loss_fn normalises by the global batch itself (top_rl.rl's
`denominator`), so splitting a batch differently does not change the update's meaning.

CpuAdamW keeps fp32 master copies of compute-dtype (bf16) weights, accumulates each micro-batch's
gradient into them in fp32, reduces over DP x CP, sums the partial q/k-norm gradients over TP (each TP
rank normalises its own heads), ties the two embedding copies across pipeline stages, clips by the
global norm (each parameter counted once) and rounds the updated master weights back into the model.
MegatronAdam wraps the model in Megatron's DDP (fp32 grad buffers) and uses `get_megatron_optimizer`
plus `finalize_model_grads`, which do the same reductions on GPU (NCCL). It cannot run on CPU
(docs/megatron.md §2.3) and is not exercised by the CPU tests.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.distributed as dist

from top_rl.train.layers import seam
from top_rl.train.parallel import Layout, groups


def _is_tp_partial(name: str) -> bool:
    return "q_layernorm" in name or "k_layernorm" in name  # the rule finalize_model_grads uses too


def _is_tp_replicated(param) -> bool:
    return not getattr(param, "tensor_model_parallel", False)


# Per-group hyperparameters the run's config sets. An optimizer's saved state carries them too (torch and
# Megatron save param_groups whole), but they belong to this run's config: a resume with
# resume_allow_changes=true trainer.lr=... must train at the new lr, not the checkpoint's.
CONFIG_HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay")


class _ConfigHyperparameters:
    def set_lr(self, lr: float) -> None:
        for group in self.opt.param_groups:
            group["lr"] = lr

    def _config_hyperparameters(self) -> list[dict]:
        return [{k: g[k] for k in CONFIG_HYPERPARAMETERS if k in g} for g in self.opt.param_groups]

    def load_state_dict(self, sd: dict) -> None:
        """The saved moments and master weights, under this optimizer's own hyperparameters (see above)."""
        mine = self._config_hyperparameters()
        self._load_state(sd)
        for group, hyper in zip(self.opt.param_groups, mine, strict=True):
            group.update(hyper)


class CpuAdamW(_ConfigHyperparameters):
    def __init__(self, model: torch.nn.Module, cfg, layout: Layout):
        self.layout, self.cfg = layout, cfg
        self.g = groups()
        self.tied = bool(model.share_embeddings_and_output_weights)
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.reset()

    def reset(self) -> None:
        """Fresh fp32 master weights from the model's current values and empty AdamW state
        (after loading new weights)."""
        cfg = self.cfg
        self.master: dict[str, torch.Tensor] = {}
        for n, p in self.named:
            self.master[n] = p if p.dtype == torch.float32 else torch.nn.Parameter(p.detach().float().clone())
        decay = [self.master[n] for n, p in self.named if p.dim() >= 2]
        no_decay = [self.master[n] for n, p in self.named if p.dim() < 2]
        # Norm weights (1-D) are not decayed, as in Megatron's default parameter groups.
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, foreach=False)

    @property
    def forward_module(self):
        return None  # the model itself

    def zero_grad(self) -> None:
        for n, p in self.named:
            p.grad = None
            self.master[n].grad = None

    def accumulate(self) -> None:
        """Move this micro-batch's parameter gradients into the fp32 master gradients."""
        for n, p in self.named:
            m = self.master[n]
            if p.grad is None or m is p:
                continue
            g = p.grad.float()
            m.grad = g if m.grad is None else m.grad.add_(g)
            p.grad = None

    def local_grads(self) -> dict[str, torch.Tensor]:
        return {n: g.clone() for n, _, g in self._grads()}

    def _grads(self):
        for n, p in self.named:
            m = self.master[n]
            if m.grad is None:
                m.grad = torch.zeros_like(m)
            yield n, p, m.grad

    @torch.no_grad()
    def step(self) -> dict[str, float]:
        lay, g = self.layout, self.g
        grads = list(self._grads())
        if lay.dp * lay.cp > 1:
            for _, _, gr in grads:
                dist.all_reduce(gr, group=g["dp_cp"])
        if lay.tp > 1:
            for n, _, gr in grads:
                if _is_tp_partial(n):
                    dist.all_reduce(gr, group=g["tp"])
        if lay.pp > 1 and self.tied:  # the embedding (first stage) and its LM-head copy (last stage)
            for n, p, gr in grads:
                if n == "embedding.word_embeddings.weight" or getattr(p, "top_tied_copy", False):
                    dist.all_reduce(gr, group=g["embedding"])
        sq = torch.zeros((), dtype=torch.float64)
        for n, p, gr in grads:
            if getattr(p, "top_tied_copy", False) or (_is_tp_replicated(p) and lay.tp_rank != 0):
                continue  # counted once: on the embedding's stage, on TP rank 0
            sq += gr.double().pow(2).sum().cpu()
        sq = sq.to(grads[0][2].device) if grads else sq
        if lay.tp * lay.pp > 1:
            dist.all_reduce(sq, group=g["mp"])
        norm = math.sqrt(float(sq))
        if not math.isfinite(norm):
            raise FloatingPointError(f"non-finite gradient norm {norm}: refusing to step")
        if self.cfg.grad_clip and norm > self.cfg.grad_clip:
            coef = self.cfg.grad_clip / (norm + 1e-6)
            for _, _, gr in grads:
                gr.mul_(coef)
        self.opt.step()
        for n, p in self.named:
            if self.master[n] is not p:
                p.copy_(self.master[n])  # round the fp32 master to the compute dtype
        self.zero_grad()
        return {"grad_norm": norm}

    def state_dict(self) -> dict:
        separate = {n for n, p in self.named if self.master[n] is not p}
        # deepcopy: torch's optimizer state_dict holds live references to exp_avg/exp_avg_sq
        return {"adamw": copy.deepcopy(self.opt.state_dict()),
                "master": {n: self.master[n].detach().clone() for n in separate}}

    def _load_state(self, sd: dict) -> None:
        with torch.no_grad():
            for n, t in sd["master"].items():
                self.master[n].copy_(t)
        self.opt.load_state_dict(copy.deepcopy(sd["adamw"]))


class MegatronAdam(_ConfigHyperparameters):
    """GPU path: Megatron DDP (fp32 grad buffers, summed over DP x CP) + Megatron's Adam/mixed precision."""

    def __init__(self, model: torch.nn.Module, cfg, layout: Layout, tc):
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        self.layout, self.cfg, self.tc = layout, cfg, tc
        tc.calculate_per_token_loss = True  # DDP sums over DP x CP instead of averaging
        self.ddp = DistributedDataParallel(
            tc, DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                              use_distributed_optimizer=False), model)
        compute = seam(tc).compute_dtype
        oc = OptimizerConfig(optimizer="adam", lr=cfg.lr, min_lr=cfg.lr, weight_decay=cfg.weight_decay,
                             adam_beta1=cfg.betas[0], adam_beta2=cfg.betas[1], adam_eps=cfg.eps,
                             clip_grad=cfg.grad_clip, bf16=compute == torch.bfloat16, params_dtype=compute,
                             use_distributed_optimizer=False)
        self.opt = get_megatron_optimizer(oc, [self.ddp])

    @property
    def forward_module(self):
        return self.ddp

    def reset(self) -> None:
        self.opt.reload_model_params()  # main (fp32) params <- freshly loaded model params

    def zero_grad(self) -> None:
        self.ddp.zero_grad_buffer()
        self.opt.zero_grad()

    def accumulate(self) -> None:
        pass  # DDP's hooks accumulate into fp32 main_grad buffers

    def local_grads(self) -> dict[str, torch.Tensor]:
        return {n: p.main_grad.detach().float().clone() for n, p in self.ddp.module.named_parameters()
                if getattr(p, "main_grad", None) is not None}

    def step(self) -> dict[str, float]:
        from megatron.core.distributed import finalize_model_grads

        finalize_model_grads([self.ddp])
        ok, grad_norm, _ = self.opt.step()
        if not ok:
            raise FloatingPointError("Megatron optimizer skipped the step (non-finite gradients)")
        self.zero_grad()
        return {"grad_norm": float(grad_norm) if grad_norm is not None else float("nan")}

    def state_dict(self) -> dict:
        return {"megatron": self.opt.state_dict()}

    def _load_state(self, sd: dict) -> None:
        self.opt.load_state_dict(sd["megatron"])
