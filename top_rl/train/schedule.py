"""Running micro-batches through this rank's pipeline stage, with explicit send/recv between stages.

Why not Megatron's schedules: they assume CUDA (streams, `device='cuda'` literals, docs/megatron.md §2.3) and
fixed activation shapes, while packed THD micro-batches have a different token count each. Here every
rank already knows each micro-batch's shape (SPMD: all ranks hold the whole batch), so stages exchange
the fp32 residual stream [T_local, 1, H] with plain `dist.send`/`dist.recv` (gloo or NCCL).

Order: forward-only scoring streams micro-batches through the stages (stage s works on micro-batch i
while stage s+1 works on i-1). Training runs each micro-batch's forward and backward before the next
(no inter-stage overlap, one micro-batch of activations alive): simple and deadlock-free at any PP;
a 1F1B order is a throughput optimisation that does not change any result.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

from top_rl.train.batch import MicroBatch
from top_rl.train.parallel import Layout


class StageRunner:
    def __init__(self, forward_module, core_model, layout: Layout, hidden_size: int, output_processor, device):
        self.forward_module = forward_module  # the model, or its DDP wrapper on GPU
        self.core = core_model  # the GPTModel (set_input_tensor)
        self.layout = layout
        self.hidden_size = hidden_size
        self.output_processor = output_processor
        self.device = device

    def _shape(self, mb: MicroBatch):
        return (mb.num_local_tokens, 1, self.hidden_size)

    def _recv(self, shape, src) -> torch.Tensor:
        t = torch.empty(shape, dtype=torch.float32, device=self.device)
        dist.recv(t, src)
        return t

    def _forward(self, mb: MicroBatch, input_tensor):
        lay = self.layout
        if not lay.first_stage:
            self.core.set_input_tensor(input_tensor)
        return self.forward_module(
            input_ids=mb.input_ids if lay.first_stage else None,
            position_ids=None,  # GPTModel's RoPE ignores them; positions come from cu_seqlens (docs/megatron.md §5)
            attention_mask=None,
            packed_seq_params=mb.params,
            output_processor=self.output_processor if lay.last_stage else None,
            output_processor_context=mb if lay.last_stage else None,
        )

    def forward_only(self, mbs: list[MicroBatch]) -> list[torch.Tensor | None]:
        """Each micro-batch's output-processor result (flat, gate) on the last stage (None elsewhere)."""
        lay, outs = self.layout, []
        for mb in mbs:
            x = None if lay.first_stage else self._recv(self._shape(mb), ps.get_pipeline_model_parallel_prev_rank())
            out = self._forward(mb, x)
            if lay.last_stage:
                outs.append(out)
            else:
                dist.send(out.contiguous(), ps.get_pipeline_model_parallel_next_rank())
                outs.append(None)
        return outs

    def forward_backward(self, mbs: list[MicroBatch], loss_of: Callable[[MicroBatch, torch.Tensor], torch.Tensor],
                         after_backward: Callable[[], None]) -> list[float]:
        """Forward and backward of every micro-batch in order; `loss_of(mb, (flat, gate))` runs on the
        last stage and its value is returned there. `after_backward` runs once per micro-batch."""
        lay, losses = self.layout, []
        for mb in mbs:
            x = None
            if not lay.first_stage:
                x = self._recv(self._shape(mb), ps.get_pipeline_model_parallel_prev_rank()).requires_grad_()
            out = self._forward(mb, x)
            if lay.last_stage:
                loss = loss_of(mb, out)
                if loss.requires_grad:
                    loss.backward()
                losses.append(float(loss.detach()))
            else:
                nxt = ps.get_pipeline_model_parallel_next_rank()
                dist.send(out.detach().contiguous(), nxt)
                grad = self._recv(out.shape, nxt)
                torch.autograd.backward(out, grad)
            if x is not None:
                g = x.grad if x.grad is not None else torch.zeros_like(x)
                dist.send(g.contiguous(), ps.get_pipeline_model_parallel_prev_rank())
            after_backward()
        return losses
