"""Dense Qwen3 over the kernel seam, in SGLang rl-mode numerics (contract qwen3_dense_top_v1, §4).

The residual stream, norm weights and embedding are fp32; every GEMM input is rounded to the compute
dtype; q/k leave their norms in fp32, get RoPE in fp32 and are rounded before attention. One forward
serves packed prefill (many sequences, cu_seqlens) and, with a KV cache, single-token decode.
"""

from __future__ import annotations

import torch
from torch import nn

from top_rl import contract, kernels
from top_rl.kernels import plan as kernel_plan
from top_rl.kernels.packed_batch import packed_batch
from top_rl.model.qwen3.config import Qwen3Config


class KVCache:
    """Per-layer K/V of `slots` sequences, [slots, max_len, Hkv, d] in the compute dtype. A token's K/V go to
    (its row, its position); a decode step over every row in order (`slots=None`) reads each layer's cache as is,
    without gathering rows."""

    def __init__(self, cfg: Qwen3Config, slots: int, max_len: int, dtype: torch.dtype, device=None):
        shape = (cfg.num_hidden_layers, slots, max_len, cfg.num_key_value_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.all_rows = torch.arange(slots, device=device)
        self.max_len = max_len

    def write(self, layer: int, rows: torch.Tensor, positions: torch.Tensor, k, v) -> None:
        self.k[layer].index_put_((rows, positions), k)
        self.v[layer].index_put_((rows, positions), v)

    def read(self, layer: int, slots) -> tuple[torch.Tensor, torch.Tensor]:
        if slots is None:
            return self.k[layer], self.v[layer]
        return self.k[layer, slots], self.v[layer, slots]


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config, policy: contract.DtypePolicy):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.cfg, self.policy = cfg, policy
        self.input_layernorm = nn.Parameter(torch.ones(h, dtype=policy.norm_weight))
        self.qkv_proj = nn.Parameter(torch.empty(cfg.q_size + 2 * cfg.kv_size, h, dtype=policy.compute))
        self.q_norm = nn.Parameter(torch.ones(d, dtype=policy.norm_weight))
        self.k_norm = nn.Parameter(torch.ones(d, dtype=policy.norm_weight))
        self.o_proj = nn.Parameter(torch.empty(h, cfg.q_size, dtype=policy.compute))
        self.post_attention_layernorm = nn.Parameter(torch.ones(h, dtype=policy.norm_weight))
        self.gate_up_proj = nn.Parameter(torch.empty(2 * cfg.intermediate_size, h, dtype=policy.compute))
        self.down_proj = nn.Parameter(torch.empty(h, cfg.intermediate_size, dtype=policy.compute))

    def attention(self, u, positions, cos_sin, cu_seqlens, cache, layer, slots, kv_lens=None):
        cfg, c = self.cfg, self.policy.compute
        t = u.shape[0]
        qkv = kernels.linear(u.to(c), self.qkv_proj)
        q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = kernels.rms_norm(q.reshape(t, -1, cfg.head_dim), self.q_norm, cfg.rms_norm_eps)
        k = kernels.rms_norm(k.reshape(t, -1, cfg.head_dim), self.k_norm, cfg.rms_norm_eps)
        q = kernels.rope(q, positions, cos_sin).to(c)
        k = kernels.rope(k, positions, cos_sin).to(c)
        v = v.reshape(t, -1, cfg.head_dim)
        scale = cfg.head_dim**-0.5
        if cache is None:
            out = kernels.attention(q, k, v, cu_seqlens, scale)
        elif cu_seqlens is not None:  # prefill into the cache: each token's K/V at (its sequence's slot, position)
            cache.write(layer, slots, positions, k, v)
            out = kernels.attention(q, k, v, cu_seqlens, scale)
        else:  # decode: one token per slot at position lengths[slot]
            cache.write(layer, cache.all_rows if slots is None else slots, positions, k, v)
            k_cache, v_cache = cache.read(layer, slots)
            out = kernels.decode_attention(q, k_cache, v_cache, kv_lens, scale)
        return kernels.row_linear(out.reshape(t, -1), self.o_proj)

    def forward(self, h, residual, positions, cos_sin, cu_seqlens, cache, layer, slots, kv_lens=None):
        eps, fp32 = self.cfg.rms_norm_eps, self.policy.norm_output
        if residual is None:  # layer 0: the embedding is both the norm input and the residual
            u, residual = kernels.rms_norm(h, self.input_layernorm, eps, out_dtype=fp32), h
        else:
            u, residual = kernels.rms_norm(h, self.input_layernorm, eps, residual, out_dtype=fp32)
        a = self.attention(u, positions, cos_sin, cu_seqlens, cache, layer, slots, kv_lens)
        u, residual = kernels.rms_norm(a, self.post_attention_layernorm, eps, residual, out_dtype=fp32)
        g = kernels.linear(u.to(self.policy.compute), self.gate_up_proj)
        d = kernels.row_linear(kernels.silu_and_mul(g), self.down_proj)
        return d, residual


class Qwen3(nn.Module):
    def __init__(self, cfg: Qwen3Config, dtype: torch.dtype | str | None = None,
                 top: contract.TopContract | None = None):
        super().__init__()
        self.cfg = cfg
        # None: the installed KernelPlan's contract, the one whose kernels this model computes with
        self.contract = top or kernel_plan.current().top
        self.policy = self.contract.policy(dtype or cfg.torch_dtype)
        p = self.policy
        self.embed_tokens = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=p.embedding))
        self.layers = nn.ModuleList(DecoderLayer(cfg, p) for _ in range(cfg.num_hidden_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size, dtype=p.norm_weight))
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=p.compute))
        )
        self.register_buffer(
            "cos_sin", kernels.rope_cache(cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings), persistent=False
        )
        self._cos_sin_device = self.cos_sin.device

    def rope_table(self) -> torch.Tensor:
        """The cos/sin cache, computed on the device the model runs on (SGLang computes it on CUDA; a
        table computed on CPU and moved can differ in the last bit)."""
        if self.cos_sin.device != self._cos_sin_device:
            cfg = self.cfg
            self.cos_sin = kernels.rope_cache(cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings,
                                              self.cos_sin.device)
            self._cos_sin_device = self.cos_sin.device
        return self.cos_sin

    @torch.no_grad()
    def init_random(self, seed: int, std: float = 0.02) -> "Qwen3":
        g = torch.Generator().manual_seed(seed)
        for name, prm in self.named_parameters():
            if prm.dim() == 2:
                prm.copy_(torch.randn(prm.shape, generator=g, dtype=torch.float32) * std)
            else:  # norm weights near 1, not exactly 1, so a wrong weight path cannot hide
                prm.copy_(1.0 + 0.1 * torch.randn(prm.shape, generator=g, dtype=torch.float32))
        return self

    def lm_head_weight(self) -> torch.Tensor:
        # §4.11: a tied head multiplies by bf(W) of the fp32 embedding table.
        w = self.embed_tokens if self.lm_head is None else self.lm_head
        return w.to(self.policy.compute)

    def new_kv_cache(self, slots: int, max_len: int) -> KVCache:
        return KVCache(self.cfg, slots, max_len, self.policy.kv_cache, self.cos_sin.device)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        from top_rl.model.qwen3.hf_names import hf_state_dict

        return hf_state_dict(self)

    def load_hf(self, sd: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        from top_rl.model.qwen3.hf_names import load_hf_state_dict

        load_hf_state_dict(self, sd, source)

    def forward(self, input_ids, positions, cu_seqlens=None, cache: KVCache | None = None, slots=None,
                logit_rows=None, lm_head=None):
        """Logits [T, V] in the compute dtype. Packed prefill: cu_seqlens given (with a cache, sequence i is written
        to slot slots[i], default i). Decode: cache given, cu_seqlens None, one token per slot in `slots` (None:
        every slot, in order). `logit_rows`: the logits of those rows only (the head is row-wise, so the same bits as
        indexing all logits). `lm_head`: lm_head_weight() computed once by the caller. A decode step reads nothing
        back from the device: its caller checks that positions stay below max_position_embeddings."""
        if cu_seqlens is not None:
            batch = packed_batch(cu_seqlens)  # host facts, read once per cu_seqlens tensor
            if batch.num_tokens and int(positions.max()) >= self.cos_sin.shape[0]:
                raise ValueError(f"position {int(positions.max())} exceeds max_position_embeddings="
                                 f"{self.cfg.max_position_embeddings}")
            if cache is not None:  # each token's slot
                seq_slots = slots if slots is not None else cache.all_rows[: len(batch.lengths)]
                slots = torch.repeat_interleave(seq_slots, cu_seqlens[1:] - cu_seqlens[:-1],
                                                output_size=batch.num_tokens)
        # decode: each row's key count, one tensor for every layer (the attention kernels derive their per-step
        # metadata from it once per forward)
        kv_lens = positions + 1 if cache is not None and cu_seqlens is None else None
        h = self.embed_tokens[input_ids]  # fp32 gather (§4.1)
        residual = None
        cos_sin = self.rope_table()
        for i, layer in enumerate(self.layers):
            h, residual = layer(h, residual, positions, cos_sin, cu_seqlens, cache, i, slots, kv_lens)
        if logit_rows is not None:
            h, residual = h[logit_rows], residual[logit_rows]
        u, _ = kernels.rms_norm(h, self.norm, self.cfg.rms_norm_eps, residual, out_dtype=self.policy.norm_output)
        return kernels.linear(u.to(self.policy.compute), self.lm_head_weight() if lm_head is None else lm_head)
