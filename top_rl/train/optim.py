"""Optimizers behind one small interface: plain torch AdamW on CPU, Megatron's optimizer on GPU.

Gradient semantics (both): a step's gradient is the SUM over micro-batches and over data/context-
parallel ranks of d loss_fn / d params; loss_fn normalises by the global batch itself (top_rl.rl's
`denominator`), so splitting a batch differently does not change the update's meaning.

CpuAdamW keeps fp32 master copies of compute-dtype (bf16) weights, accumulates each micro-batch's
gradient into them in fp32, reduces over DP x CP, sums the partial q/k-norm gradients over TP (each TP
rank normalises its own heads), ties the two embedding copies across pipeline stages, clips by the
global norm (each parameter counted once) and rounds the updated master weights back into the model.
GpuAdamW wraps the model in Megatron's DDP (fp32 grad buffers, `finalize_model_grads` does the same reductions
on GPU over NCCL) and steps fp32 master weights with torch's fused AdamW, without a single host sync: the global
norm is `torch._foreach_norm` reduced on the device, clipping is the fused kernel's `grad_scale`
(grad / max(1, (norm + 1e-6) / clip), Megatron's clip coefficient), and a non-finite norm sets the kernel's
`found_inf`, which leaves weights, moments and step counts as they were; the trainer reads the norm once, after the
step is queued, and refuses a non-finite one (top_rl.train.trainer). Megatron's own optimizer, without Apex or
Transformer Engine, drained the GPU queue 226 times a 0.6B step in its grad-norm fallback (bench/host_time.py).
With trainer.offload_during_rollout, GpuAdamW parks its fp32 masters and Adam state in pinned host memory and frees DDP's
gradient buffers between steps, the tensors keeping their identity (top_rl/train/offload.py).
Megatron's DDP cannot run on CPU (docs/megatron.md §2.3); the fused step (FusedMasterAdamW) runs on either device,
and tests/train/test_fused_adamw.py checks it on CPU against torch's for-loop AdamW.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.distributed as dist

from top_rl.train.optim_state import load_named_state, named_state
from top_rl.train.offload import HostCopies, refuse_offloaded, release_grad_buffers, restore_grad_buffers
from top_rl.train.parallel import Layout, groups


def _is_tp_partial(name: str) -> bool:
    return "q_layernorm" in name or "k_layernorm" in name  # the rule finalize_model_grads uses too


def _is_tp_replicated(param) -> bool:
    return not getattr(param, "tensor_model_parallel", False)


def counted_once(param, layout: Layout) -> bool:
    """Whether this rank's copy of `param` enters the global gradient norm: each parameter once, on the embedding's
    stage (not its tied LM-head copy) and on TP rank 0 for TP-replicated ones (Megatron's clip_grads rule)."""
    return not (getattr(param, "top_tied_copy", False) or (_is_tp_replicated(param) and layout.tp_rank != 0))


def fp32_masters(named: list[tuple[str, torch.nn.Parameter]]) -> dict[str, torch.Tensor]:
    """An fp32 master of each parameter, from its current value; a parameter already in fp32 is its own master."""
    return {n: p if p.dtype == torch.float32 else torch.nn.Parameter(p.detach().float().clone()) for n, p in named}


def adamw(named: list[tuple[str, torch.nn.Parameter]], master: dict[str, torch.Tensor], cfg,
          **kernel) -> torch.optim.AdamW:
    """torch's AdamW over the masters, in the two parameter groups both optimizers step: matrices decayed by
    cfg.weight_decay, norm weights (1-D) not, as in Megatron's default parameter groups. `kernel`: foreach=False
    (CpuAdamW's for-loop) or fused=True (FusedMasterAdamW), the one thing the two differ in."""
    decay = [master[n] for n, p in named if p.dim() >= 2]
    no_decay = [master[n] for n, p in named if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, **kernel)


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
        self.master = fp32_masters(self.named)
        self.opt = adamw(self.named, self.master, self.cfg, foreach=False)

    @property
    def forward_module(self):
        return None  # the model itself

    # trainer.offload_during_rollout is a GPU setting (it needs cluster.gpu_handoff): on the CPU nothing moves
    offloaded = False

    def offload(self) -> None:
        pass

    def onload(self) -> None:
        pass

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
            if counted_once(p, lay):
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

    def named_state(self) -> dict:
        return named_state(self.named, self.master, self.opt)

    def load_named_state(self, sd: dict) -> None:
        """After the model's weights are loaded (top_rl.run.dist_state)."""
        load_named_state(self.named, self.master, self.opt, sd)



class FusedMasterAdamW:
    """fp32 master weights of a model's parameters stepped by torch's fused AdamW with no host sync (module doc).
    `grads`: parameter name -> the fp32 tensor holding its summed gradient (DDP's main_grad on GPU; any fp32 tensor
    in the CPU tests). Parameters already in fp32 are their own master; the parameter groups are adamw()'s, as
    CpuAdamW's."""

    def __init__(self, named: list[tuple[str, torch.nn.Parameter]], grads: dict[str, torch.Tensor], cfg,
                 layout: Layout, norm_group=None):
        self.named, self.grads, self.cfg, self.layout = named, grads, cfg, layout
        self.norm_group = norm_group  # the model-parallel group the squared norm is summed over (None: one rank)
        self.counted = [grads[n] for n, p in named if counted_once(p, layout)]
        self.reset()

    def reset(self) -> None:
        """Fresh fp32 masters from the model's current values and empty AdamW state (after loading new weights).
        Parked copies of the old ones are dropped with them."""
        self.host = HostCopies()
        self.master = fp32_masters(self.named)
        self.rounded = [(p, self.master[n]) for n, p in self.named if self.master[n] is not p]
        self.opt = adamw(self.named, self.master, self.cfg, fused=True)

    @property
    def offloaded(self) -> bool:
        return bool(self.host.parked)

    def offload(self) -> None:
        """Park the fp32 masters of compute-dtype parameters and every AdamW state tensor (exp_avg, exp_avg_sq, step)
        in host memory (HostCopies). fp32 parameters are their own master: they are the model's weights and stay.
        Idempotent."""
        if not self.offloaded:
            state = [v for s in self.opt.state.values() for v in s.values() if torch.is_tensor(v)]
            self.host.offload([m for _, m in self.rounded] + state)

    def onload(self) -> None:
        """Bring back what `offload` parked, bitwise, into the same tensors. Idempotent."""
        self.host.onload()

    @torch.no_grad()
    def global_norm(self) -> torch.Tensor:
        """The fp32 L2 norm of all gradients, each parameter counted once, as a device tensor (no sync)."""
        device = next(iter(self.grads.values())).device
        norms = torch._foreach_norm(self.counted) if self.counted else [torch.zeros((), device=device)]
        sq = torch.stack(norms).float().pow(2).sum()
        if self.norm_group is not None:
            dist.all_reduce(sq, group=self.norm_group)
        return sq.sqrt()

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """Clip, step and round the masters into the model; returns the gradient norm as a device tensor."""
        if self.offloaded:
            refuse_offloaded("an optimizer step")
        norm = self.global_norm()
        clip = self.cfg.grad_clip
        # the fused kernel divides each gradient by grad_scale: Megatron's coefficient clip / (norm + 1e-6) when < 1
        self.opt.grad_scale = ((norm + 1e-6) / clip).clamp(min=1.0) if clip else None
        self.opt.found_inf = (~torch.isfinite(norm)).float()  # skips the update on the device
        for n, _ in self.named:
            self.master[n].grad = self.grads[n]
        try:
            self.opt.step()  # the fused kernel also leaves each gradient divided by grad_scale, in place
        finally:
            for n, _ in self.named:
                self.master[n].grad = None  # the model's own .grad must stay free for DDP's hooks
        if self.rounded:
            torch._foreach_copy_([p.data for p, _ in self.rounded], [m for _, m in self.rounded])
        return norm

    def state_dict(self) -> dict:
        """Offloaded, the saved values are the host copies themselves, not copies of them (a checkpoint between steps
        needs no device memory and no second host copy: at 4B they are ~46 GB; they change only at the next offload,
        after the checkpoint is written)."""
        def value(t):
            host = self.host.host_of(t) if torch.is_tensor(t) else None
            return t if host is None else host

        sd = self.opt.state_dict()
        sd = {**sd, "state": {k: {n: value(v) for n, v in s.items()} for k, s in sd["state"].items()}}
        # deepcopy: torch's optimizer state_dict holds live references to exp_avg/exp_avg_sq
        separate = {id(m) for _, m in self.rounded}  # fp32 parameters are their own master: saved with the model
        parked = {id(h): h for _, h, _ in self.host.parked}  # deepcopy's memo: the host copies are not copied again
        return {"adamw": copy.deepcopy(sd, parked),
                "master": {n: (value(m) if id(value(m)) in parked else m.detach().clone())
                           for n, m in self.master.items() if id(m) in separate}}

    def named_state(self) -> dict:
        """Offloaded, the host copies themselves (see state_dict)."""
        def value(t):
            host = self.host.host_of(t)
            return t if host is None else host

        return named_state(self.named, self.master, self.opt, value)

    def load_named_state(self, sd: dict) -> None:
        self.onload()  # the loaded values go into the device tensors
        load_named_state(self.named, self.master, self.opt, sd)
        with torch.no_grad():
            for p, m in self.rounded:
                p.copy_(m)

    def load_state(self, sd: dict) -> None:
        self.onload()  # the loaded values go into the device tensors
        with torch.no_grad():
            for n, t in sd["master"].items():
                self.master[n].copy_(t)
            for p, m in self.rounded:
                p.copy_(m)
        self.opt.load_state_dict(copy.deepcopy(sd["adamw"]))


class GpuAdamW(_ConfigHyperparameters):
    """GPU path: Megatron DDP (fp32 grad buffers, summed over DP x CP) + FusedMasterAdamW (no host sync)."""

    def __init__(self, model: torch.nn.Module, cfg, layout: Layout, tc):
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        self.layout, self.cfg, self.tc = layout, cfg, tc
        tc.calculate_per_token_loss = True  # DDP sums over DP x CP instead of averaging
        self.ddp = DistributedDataParallel(
            tc, DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                              use_distributed_optimizer=False), model)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        mp = groups()["mp"] if layout.tp * layout.pp > 1 else None
        self.fused = FusedMasterAdamW(named, {n: p.main_grad for n, p in named}, cfg, layout, norm_group=mp)
        self.released_grads: list[tuple[torch.Tensor, int]] = []  # DDP's grad buffers while offloaded

    @property
    def opt(self):  # the torch optimizer: its param_groups carry the lr (_ConfigHyperparameters)
        return self.fused.opt

    @property
    def forward_module(self):
        return self.ddp

    def reset(self) -> None:
        self.onload()
        self.fused.reset()  # fp32 masters <- freshly loaded model params

    @property
    def offloaded(self) -> bool:
        return self.fused.offloaded or bool(self.released_grads)

    def offload(self) -> None:
        """Between steps (trainer.offload_during_rollout): the fp32 masters and Adam moments to pinned host memory
        (FusedMasterAdamW.offload), DDP's fp32 gradient buffers freed (zero between steps: nothing to copy). What stays
        on the GPU is the model's weights, which the weight push reads. Idempotent."""
        self.fused.offload()
        if not self.released_grads:
            self.released_grads = release_grad_buffers(self.ddp)

    def onload(self) -> None:
        """Before the next step: the state back, bitwise, in the same tensors; the gradient buffers re-allocated and
        zeroed. Idempotent."""
        restore_grad_buffers(self.released_grads)
        self.released_grads = []
        self.fused.onload()

    def zero_grad(self) -> None:
        if self.offloaded:
            refuse_offloaded("zeroing the gradients (a backward or a step)")
        self.ddp.zero_grad_buffer()

    def accumulate(self) -> None:
        pass  # DDP's hooks accumulate into fp32 main_grad buffers

    def local_grads(self) -> dict[str, torch.Tensor]:
        if self.offloaded:
            refuse_offloaded("reading the gradients")
        return {n: p.main_grad.detach().float().clone() for n, p in self.ddp.module.named_parameters()
                if getattr(p, "main_grad", None) is not None}

    def step(self) -> dict[str, torch.Tensor]:
        from megatron.core.distributed import finalize_model_grads

        if self.offloaded:
            refuse_offloaded("an optimizer step")
        finalize_model_grads([self.ddp])
        norm = self.fused.step()
        self.zero_grad()
        return {"grad_norm": norm}

    def state_dict(self) -> dict:
        return {"fused_adamw": self.fused.state_dict()}

    def named_state(self) -> dict:
        return self.fused.named_state()

    def load_named_state(self, sd: dict) -> None:
        self.onload()
        self.fused.load_named_state(sd)

    def _load_state(self, sd: dict) -> None:
        if "fused_adamw" not in sd:  # a shard written by Megatron's optimizer (before GpuAdamW)
            raise ValueError(f"top-rl: this trainer shard's optimizer state is {sorted(sd)} (Megatron's optimizer, "
                             "top-rl before GpuAdamW); resume it with that release, or start the run afresh")
        self.onload()
        self.fused.load_state(sd["fused_adamw"])
