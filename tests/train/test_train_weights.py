"""HF <-> Megatron weights: names, fused layouts, TP shards; every round trip exact (torch.equal)."""

from __future__ import annotations

import pytest
import torch

from tests.train.common import export_hf_weights, reference_model, tiny_config
from top_rl.model import hf_state_dict, load_model, save_model
from top_rl.train import Trainer, TrainerSettings
from top_rl.model.qwen3 import hf_names as F  # the family's HF <-> Megatron maps
from top_rl.model import megatron_tp as W  # TP shards


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hf_megatron_round_trip(tied, dtype):
    cfg = tiny_config(3, tied=tied)
    hf = hf_state_dict(reference_model(cfg, dtype))
    mg = F.hf_to_megatron(hf, cfg)
    assert set(mg) == set(F.megatron_names(cfg))
    for name, t in mg.items():
        assert tuple(t.shape) == F.full_shape(name, cfg), name
    back = F.megatron_to_hf(mg, cfg)
    assert set(back) == set(hf)
    for k in hf:
        assert back[k].dtype == hf[k].dtype and torch.equal(back[k], hf[k]), k


def test_qkv_is_interleaved_per_query_group_and_fc1_is_gate_then_up():
    cfg = tiny_config(0, tied=True).replace(num_attention_heads=4, num_key_value_heads=2, head_dim=2, hidden_size=3)
    d, h = cfg.head_dim, cfg.hidden_size
    q = torch.arange(4 * d * h, dtype=torch.float32).reshape(4 * d, h)
    k = 1000 + torch.arange(2 * d * h, dtype=torch.float32).reshape(2 * d, h)
    v = 2000 + torch.arange(2 * d * h, dtype=torch.float32).reshape(2 * d, h)
    qkv = F.interleave_qkv(q, k, v, cfg)
    # group 0: q heads 0,1 then k head 0 then v head 0; group 1: q heads 2,3, k1, v1
    want = torch.cat([q[: 2 * d], k[:d], v[:d], q[2 * d :], k[d:], v[d:]])
    assert torch.equal(qkv, want)
    assert all(torch.equal(a, b) for a, b in zip(F.split_qkv(qkv, cfg), (q, k, v)))
    gate, up = torch.zeros(4, 3), torch.ones(4, 3)
    fc1 = torch.cat([gate, up])
    r1 = W.shard("decoder.layers.0.mlp.linear_fc1.weight", fc1, tp=2, rank=1)
    assert torch.equal(r1, torch.cat([gate[2:], up[2:]]))  # [gate shard; up shard], not a plain chunk


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tp_shard_round_trip(tp):
    cfg = tiny_config(1, tied=False, tp_friendly=True).replace(num_attention_heads=8, num_key_value_heads=4,
                                                              vocab_size=96)
    mg = F.hf_to_megatron(hf_state_dict(reference_model(cfg, "float32")), cfg)
    for name, full in mg.items():
        parts = [W.shard(name, full, tp, r) for r in range(tp)]
        assert torch.equal(W.unshard(name, parts), full), name
        if name.endswith("linear_qkv.weight"):  # whole query groups per rank
            per_group = (cfg.num_attention_heads // cfg.num_key_value_heads + 2) * cfg.head_dim
            assert parts[0].shape[0] % per_group == 0


@pytest.mark.parametrize("tied,dtype", [(True, "bfloat16"), (False, "float32")])
def test_trainer_load_and_export_exact(tmp_path, tied, dtype):
    """A checkpoint directory loads into the trainer and comes back out bit for bit (norms and the
    embedding fp32, linears in the compute dtype: what the engine holds)."""
    cfg = tiny_config(5, tied=tied)
    model = reference_model(cfg, dtype)
    save_model(model, tmp_path)
    trainer = Trainer(cfg, TrainerSettings(dtype=dtype))
    trainer.load_hf(tmp_path)
    out = export_hf_weights(trainer)
    want = hf_state_dict(load_model(tmp_path, dtype))
    assert set(out) == set(want)
    for k in want:
        assert out[k].dtype == want[k].dtype and torch.equal(out[k], want[k]), k
