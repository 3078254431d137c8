"""The trainer the RL loop drives: Megatron-core over the kernel seam (the model family's layer spec), log-probs bitwise equal
to the rollout engine's.

SPMD: construct one `Trainer` per rank (after `parallel.init_process_group`) and call the same method
with the same arguments on every rank; every method returns the same value on every rank (log-probs,
metrics and exported weights are gathered/broadcast), so a driver may read any rank's answer.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from top_rl.contract import as_dtype
from top_rl.model import family
from top_rl.model.family import UnsupportedModel
from top_rl.rl import lr_schedule
from top_rl.model import megatron_tp
from top_rl.train import cpu_shims, parallel, recompute
from top_rl.train.batch import TrainSequence, pack_micro_batch, plan
from top_rl.config.trainer import TrainerConfig, TrainerSettings
from top_rl.train.logprobs import make_output_processor, split_per_sample
from top_rl.train.optim import CpuAdamW, GpuAdamW
from top_rl.train.schedule import StageRunner
from top_rl.train.snapshots import PolicySnapshots

# Each model family's Megatron layer spec (transformer_config, build_gpt_model), by family name: the trainer's
# side of a family (top_rl/model/family.py), kept here so the model package never imports Megatron.
MEGATRON_SPECS = {"qwen3": "top_rl.train.qwen3_megatron"}

LossFn = Callable[[list[torch.Tensor], list[int]], torch.Tensor]


class Trainer:
    def __init__(self, model_cfg, cfg: TrainerConfig | None = None):
        """`model_cfg`: the model family's architecture config (top_rl/model/family.py); `cfg`: TrainerSettings (a
        TrainerConfig: the compute dtype is the model config's torch_dtype)."""
        cfg = cfg if cfg is not None else TrainerConfig()
        # own copy (micro-batching is adjustable), its dtype decided
        cfg = TrainerSettings.of(cfg, dtype=getattr(cfg, "dtype", None) or model_cfg.torch_dtype)
        self.model_cfg, self.cfg = model_cfg, cfg
        self.family = family.of(model_cfg)
        spec = importlib.import_module(MEGATRON_SPECS[model_cfg.family])
        if model_cfg.num_hidden_layers % cfg.pp:
            raise ValueError(f"{model_cfg.num_hidden_layers} layers do not split evenly over PP={cfg.pp}")
        self.compute_dtype = as_dtype(cfg.dtype)
        cpu_shims.apply()
        if cfg.recompute:
            recompute.install()
        torch.manual_seed(cfg.seed)
        parallel.init_process_group()  # no-op when the driver already joined this rank to its group
        self.layout = parallel.init_model_parallel(cfg.tp, cfg.pp, cfg.cp)
        self.groups = parallel.groups()
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        self.tc = spec.transformer_config(model_cfg, compute_dtype=self.compute_dtype, tp=cfg.tp, pp=cfg.pp,
                                          cp=cfg.cp, recompute=cfg.recompute, cpu=self.device.type == "cpu",
                                          megatron_rope=cfg.megatron_rope)
        self.model = spec.build_gpt_model(model_cfg, self.tc, pp_rank=self.layout.pp_rank, device=self.device)
        self.offset = parallel.layer_offset(self.tc, self.layout.pp_rank)
        if self.device.type == "cpu":
            self.optimizer = CpuAdamW(self.model, cfg, self.layout)
        else:
            self.optimizer = GpuAdamW(self.model, cfg, self.layout, self.tc)
        processor = make_output_processor(self.groups["tp"], self.groups["cp"])
        self.runner = StageRunner(self.optimizer.forward_module or self.model, self.model, self.layout,
                                  model_cfg.hidden_size, processor, self.device)
        self.step = 0
        self.last_lr = cfg.lr  # the lr of the latest update (top_rl.rl.lr_schedule)
        # the live weights' version and copies of older ones a lagged batch needs (rollout.policy_lag; none at 0)
        self.snapshots = PolicySnapshots(keep=0)

    # ---------------------------------------------------------------- weights
    @torch.no_grad()
    def load_hf(self, src: str | Path | Mapping[str, torch.Tensor]) -> None:
        """Load an HF checkpoint directory of the trainer's family or an HF-named state dict (e.g. `hf_state_dict(model)`).
        Each parameter keeps its contract dtype (values are rounded into it, as the engine does)."""
        if not isinstance(src, Mapping):
            from top_rl.model.hf_io import read_safetensors

            ckpt_cfg = family.config_from_dir(src)
            if _arch(ckpt_cfg) != _arch(self.model_cfg):
                raise UnsupportedModel(f"{src} has config {ckpt_cfg}, the trainer was built for {self.model_cfg}")
            src = read_safetensors(src)
        full = self.family.hf_to_megatron(src, self.model_cfg)
        lay = self.layout
        for name, p in self.model.named_parameters():
            g = megatron_tp.global_name(name, self.offset)
            if getattr(p, "top_tied_copy", False):
                g = "embedding.word_embeddings.weight"
            value = megatron_tp.shard(g, full[g], lay.tp, lay.tp_rank)
            if tuple(value.shape) != tuple(p.shape):
                raise UnsupportedModel(f"{g}: shard shape {tuple(value.shape)} != parameter {tuple(p.shape)}")
            p.copy_(value)
        self.optimizer.reset()  # master weights from the loaded values, empty optimizer state

    def iter_hf_weights(self):
        """(HF name, full tensor) for the whole model, on every rank, in a fixed order: TP shards are
        all-gathered, pipeline stages broadcast theirs. Norms and the embedding are fp32, linears are in
        the compute dtype: exactly the values the trainer computes with (what an engine must load)."""
        lay, cfg = self.layout, self.model_cfg
        local = {megatron_tp.global_name(n, self.offset): p for n, p in self.model.named_parameters()
                 if not getattr(p, "top_tied_copy", False)}
        stage_of = self._stage_of_names()
        pp_group = self.groups["pp"]

        def full_tensor(name):
            if name in local:
                t = local[name].detach()
                if lay.tp > 1 and megatron_tp.tp_kind(name) != "replicated":
                    parts = [torch.empty_like(t) for _ in range(lay.tp)]
                    dist.all_gather(parts, t.contiguous(), group=self.groups["tp"])
                    t = megatron_tp.unshard(name, parts)
                t = t.clone()
            else:
                t = torch.empty(self.family.full_shape(name, cfg), dtype=self._dtype_of(name), device=self.device)
            if lay.pp > 1:
                dist.broadcast(t, dist.get_global_rank(pp_group, stage_of[name]), group=pp_group)
            return t

        for name in self.family.megatron_names(cfg):
            yield from self.family.iter_megatron_to_hf([(name, full_tensor(name))], cfg)

    def _dtype_of(self, name: str) -> torch.dtype:
        fp32 = name.endswith("layernorm.weight") or name == "embedding.word_embeddings.weight"
        return torch.float32 if fp32 else self.compute_dtype

    def _stage_of_names(self) -> dict[str, int]:
        pp, n = self.layout.pp, self.model_cfg.num_hidden_layers
        out = {}
        for name in self.family.megatron_names(self.model_cfg):
            if name.startswith("decoder.layers."):
                out[name] = megatron_tp.layer_of(name)[0] * pp // n  # Megatron's even split
            else:
                out[name] = 0 if name.startswith("embedding") else pp - 1
        return out

    # ---------------------------------------------------------------- scoring and training
    def _micro_batches(self, batch: Sequence[TrainSequence]):
        lay = self.layout
        for idx in plan(batch, dp_rank=lay.dp_rank, dp_size=lay.dp, micro_batch_size=self.cfg.micro_batch_size,
                        micro_batch_tokens=self.cfg.micro_batch_tokens):
            yield pack_micro_batch(batch, idx, cp_size=lay.cp, cp_rank=lay.cp_rank, device=self.device)

    def _owns_results(self) -> bool:
        lay = self.layout
        return lay.last_stage and lay.tp_rank == 0 and lay.cp_rank == 0

    @torch.no_grad()
    def logprobs(self, batch: Sequence[TrainSequence]) -> list[torch.Tensor]:
        """Per-sample log-probs of tokens[prompt_len:] (forward only, eval mode), each by its kind's
        engine formula: fp32 prefill scores, or compute-dtype sampler@T log-probs."""
        flats, _ = self._forward_scores(batch, gates=False)
        out = []
        for flat, s in zip(flats, batch):
            dtype = torch.float32 if s.temperature is None else self.compute_dtype
            out.append(flat.to(dtype).cpu())
        return out

    @torch.no_grad()
    def logprobs_and_gate(self, batch: Sequence[TrainSequence]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One forward only: per sample, the loss's log-probs (as `logprobs` gives them) and the gate's numbers
        (float64, as the training forward gathers them: `TrainSequence.gate_prefill` rows hold the fp32 prefill
        log-probs of the same logits). The behaviour forward of a lagged step (top_rl.train.rl_step)."""
        flats, gates = self._forward_scores(batch, gates=True)
        return ([flat.to(torch.float32 if s.temperature is None else self.compute_dtype).cpu()
                 for flat, s in zip(flats, batch)], [g.cpu() for g in gates])

    def _forward_scores(self, batch, gates: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per sample, the forward's scored log-probs (and with `gates` its gate numbers), float64, from every rank."""
        self.model.eval()
        mbs = list(self._micro_batches(batch))
        outs = self.runner.forward_only(mbs)
        sizes = [s.num_scored for s in batch]
        starts = [0]
        for n in sizes:
            starts.append(starts[-1] + n)
        total = torch.zeros((2 if gates else 1) * starts[-1], dtype=torch.float64, device=self.device)
        if self._owns_results():
            for mb, (flat, gate) in zip(mbs, outs):
                for i, part, g in zip(mb.indices, flat.split(mb.scored_sizes), gate.split(mb.scored_sizes)):
                    total[starts[i] : starts[i + 1]] = part.double()
                    if gates:
                        total[starts[-1] + starts[i] : starts[-1] + starts[i + 1]] = g.double()
        if dist.get_world_size() > 1:
            dist.all_reduce(total)  # one contributing rank per entry: exact
        flats = [total[starts[i] : starts[i + 1]] for i in range(len(batch))]
        gate_parts = [total[starts[-1] + starts[i] : starts[-1] + starts[i + 1]] for i in range(len(batch))] if gates else []
        return flats, gate_parts

    def train_step(self, batch: Sequence[TrainSequence], loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step over `batch`. For each micro-batch, `loss_fn(logprobs, indices)` gets the
        per-sample log-prob tensors (with grad) of the samples batch[indices] and returns a scalar; the
        step minimises the sum of those scalars over micro-batches (and DP ranks), so loss_fn must
        normalise by the global batch itself."""
        losses, n_mbs = self._backward(batch, loss_fn)
        grad_norm = self.optimizer_step()
        loss = torch.tensor([sum(losses) if self._owns_results() else 0.0], dtype=torch.float64, device=self.device)
        if dist.get_world_size() > 1:
            dist.all_reduce(loss)
        n_tokens = sum(len(s.tokens) for s in batch)
        return {"loss": float(loss), "grad_norm": grad_norm, "step": self.step, "micro_batches": n_mbs,
                "tokens": n_tokens, "lr": self.last_lr}

    def rl_step(self, batch, cfg=None):
        """One RL step with the gate in the training forward (top_rl.train.rl_step): rank 0 returns the
        StepReport, the other ranks None."""
        from top_rl.rl.batch import RLStepConfig
        from top_rl.train.rl_step import run

        return run(self, batch, cfg or RLStepConfig())

    def optimizer_step(self) -> float:
        """Apply the accumulated gradients; returns the gradient norm. The GPU optimizer queues its step without a
        host sync and skips a non-finite one on the device; reading the norm here is the step's one sync."""
        schedule = lr_schedule.of(self.cfg)
        self.last_lr = schedule.lr_at(self.step)  # self.step: the updates taken, checkpointed (resume sets the same)
        if not schedule.is_constant:  # a constant lr is left as the optimizer was built with it
            self.optimizer.set_lr(self.last_lr)
        norm = float(self.optimizer.step()["grad_norm"])
        if not math.isfinite(norm):
            raise FloatingPointError(f"non-finite gradient norm {norm}: the optimizer step was skipped")
        self.step += 1
        return norm

    def backward_micro_batches(self, batch: Sequence[TrainSequence], loss_of) -> tuple[list[float], int]:
        """Zero the gradients, then forward and backward this rank's micro-batches of `batch`, accumulating
        gradients (no step). `loss_of(micro_batch, (flat, gate))` runs where the logits are
        (top_rl.train.schedule); returns its values there and the number of micro-batches."""
        self.model.train()
        self.optimizer.zero_grad()
        mbs = list(self._micro_batches(batch))
        return self.runner.forward_backward(mbs, loss_of, self.optimizer.accumulate), len(mbs)

    def _backward(self, batch, loss_fn) -> tuple[list[float], int]:
        def loss_of(mb, out):
            return loss_fn(split_per_sample(out[0], batch, mb.indices, self.compute_dtype), mb.indices)

        return self.backward_micro_batches(batch, loss_of)

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """This rank's shard of the training state (weights under local Megatron names, optimizer,
        step, layout). Save one per rank; restore on the same layout."""
        return {"model": {n: p.detach().clone() for n, p in self.model.named_parameters()},
                "optimizer": self.optimizer.state_dict(), "step": self.step,
                "policy_versions": self.snapshots.state_dict(),
                "layout": dataclasses.asdict(self.layout), "model_config": dataclasses.asdict(self.model_cfg)}

    @torch.no_grad()
    def load_state_dict(self, sd: dict) -> None:
        if sd["layout"] != dataclasses.asdict(self.layout):
            raise ValueError(f"checkpoint shard is for layout {sd['layout']}, this rank is {self.layout}")
        params = dict(self.model.named_parameters())
        if set(params) != set(sd["model"]):
            raise ValueError(f"checkpoint parameters differ: {sorted(set(params) ^ set(sd['model']))}")
        for n, p in params.items():
            p.copy_(sd["model"][n])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.step = sd["step"]
        if "policy_versions" in sd:  # shards before rollout.policy_lag have none (the driver sets the version)
            self.snapshots.load_state_dict(sd["policy_versions"], self.device)


def _arch(c) -> tuple:
    d = dataclasses.asdict(c)
    for k in ("torch_dtype", "bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings"):
        d.pop(k)
    return tuple(sorted(d.items()))
