"""RoPE guard: Megatron's own unfused, non-interleaved RoPE (the path the trainer uses, rope fusion off)
is bitwise our `kernels.rope` (= SGLang's NeoX forward_native) on fp32 and bf16 inputs, per packed
sequence with positions restarting at 0, with the table Megatron's RotaryEmbedding builds."""

from __future__ import annotations

import pytest
import torch
from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

from top_rl import kernels
from top_rl.model import Qwen3Config, packed_positions
from top_rl.train import TrainSequence, cpu_shims
from top_rl.train.batch import pack_micro_batch
from top_rl.train.qwen3_megatron import transformer_config


class _NoCP:  # a context-parallel group of one, so no process group is needed
    def size(self):
        return 1

    def rank(self):
        return 0


def _megatron_rope(x, lengths, head_dim, base):
    """x [T, H, d] packed sequences of `lengths` -> Megatron's THD RoPE, as its attention calls it."""
    cpu_shims.apply()
    cfg = Qwen3Config(head_dim=head_dim, rope_theta=base, num_attention_heads=x.shape[1],
                      num_key_value_heads=x.shape[1], hidden_size=64)
    tc = transformer_config(cfg, compute_dtype=x.dtype)
    rope = RotaryEmbedding(kv_channels=head_dim, rotary_percent=1.0, rotary_interleaved=False, rotary_base=base,
                           use_cpu_initialization=True, cp_group=_NoCP())
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    freqs = rope(max(lengths), packed_seq=True, cp_group=_NoCP())
    return apply_rotary_pos_emb(x, freqs, config=tc, cu_seqlens=cu, cp_group=_NoCP())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim,base", [(16, 1_000_000.0), (128, 1_000_000.0), (64, 10_000.0)])
def test_megatron_unfused_rope_equals_seam_rope(dtype, head_dim, base):
    g = torch.Generator().manual_seed(head_dim)
    lengths = [300, 1, 57, 128]
    x = (torch.randn(sum(lengths), 4, head_dim, generator=g) * 3).to(dtype)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    want = kernels.rope(x, packed_positions(cu), kernels.rope_cache(head_dim, base, 512))
    got = _megatron_rope(x, lengths, head_dim, base)
    assert got.dtype == dtype
    assert torch.equal(got, want)


def test_rope_runs_in_fp32_before_the_cast():
    """The contract's order (RoPE on the fp32 q/k-norm output, then round) differs from rounding first;
    the trainer feeds Megatron's RoPE the fp32 tensor, so it must match the fp32-then-round result."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, 16, generator=g)
    fp32_then_round = _megatron_rope(x, [40], 16, 1e6).to(torch.bfloat16)
    cache = kernels.rope_cache(16, 1e6, 64)
    assert torch.equal(fp32_then_round, kernels.rope(x, torch.arange(40), cache).to(torch.bfloat16))
    assert not torch.equal(fp32_then_round, kernels.rope(x.to(torch.bfloat16), torch.arange(40), cache))


def test_packing_never_sets_max_seqlen_to_the_total():
    """docs/megatron.md §8 pitfall: max_seqlen == total tokens makes Megatron continue positions across packed
    sequences. `pack` sets it to the longest sequence, and the seam RoPE's positions restart at 0."""
    batch = [TrainSequence([1] * n, 1) for n in (5, 9, 3)]
    mb = pack_micro_batch(batch, [0, 1, 2])
    assert mb.params.max_seqlen_q == mb.params.max_seqlen_kv == 9
    assert mb.params.cu_seqlens_q.tolist() == [0, 5, 14, 17]
    assert mb.params.positions.tolist() == [*range(5), *range(9), *range(3)]


def test_megatron_rope_is_refused_with_the_sglang_kernels_naming_the_key():
    """Megatron's eager RoPE is bitwise only the eager engines' (above); with the sglang kernels the engine's RoPE is
    compiled, so the gate would fail at step 1: refused at composition, naming the key and the fix."""
    from top_rl.cli import compose
    from top_rl.config import ConfigError

    sglang = ["top.kernels=sglang", "rollout.logprob_source=prefill"]
    assert not compose(sglang).trainer.megatron_rope
    assert compose(["trainer.megatron_rope=true"]).trainer.megatron_rope  # the reference kernels' RoPE is eager
    with pytest.raises(ConfigError, match="trainer.megatron_rope=true with top.kernels=sglang.*set "
                                          "trainer.megatron_rope=false"):
        compose([*sglang, "trainer.megatron_rope=true"])
