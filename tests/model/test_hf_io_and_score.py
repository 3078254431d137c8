"""Against an independent implementation (transformers' Qwen3) and through the checkpoint format."""

import json
import subprocess
import sys

import pytest
import torch

from top_rl.model import NotDenseQwen3, Qwen3Config, load_model, pack, save_model
from tests.helpers import tiny_model, use_backend

transformers = pytest.importorskip("transformers")


def _hf_checkpoint(path, tied: bool, gqa: int):
    cfg = transformers.Qwen3Config(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4 // gqa, head_dim=16, max_position_embeddings=128, tie_word_embeddings=tied,
        rope_theta=10000.0, torch_dtype="float32",
    )
    torch.manual_seed(gqa + 10 * tied)
    hf = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # norm weights away from 1 so a misplaced norm weight shows
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    hf.save_pretrained(path)
    return hf


SEQS = [[1, 5, 7, 9, 11, 3], [4, 2], [8, 8, 8, 1, 2, 3, 4, 5, 6, 7, 60, 61, 90]]


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("gqa", [1, 2])
def test_logits_match_transformers_fp32(tmp_path, tied, gqa):
    hf = _hf_checkpoint(tmp_path, tied, gqa)
    with use_backend("reference"), torch.no_grad():
        ours = load_model(tmp_path, "float32")
        ids, pos, cu = pack(SEQS)
        logits = ours(ids, pos, cu)
        ref = torch.cat([hf(torch.tensor([s])).logits[0] for s in SEQS])
    rel = (logits - ref).abs().max() / ref.abs().max()
    assert rel <= 1e-5, f"relative error {rel:.3g}"


def test_score_cli_loads_transformers_checkpoint(tmp_path):
    hf = _hf_checkpoint(tmp_path, tied=True, gqa=2)
    ids = SEQS[2]
    out = subprocess.run(
        [sys.executable, "-m", "top_rl.tools.score", "--model", str(tmp_path), "--input-ids", ",".join(map(str, ids))],
        capture_output=True, text=True, check=True,
    )
    got = torch.tensor(json.loads(out.stdout)["logprobs"])
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), -1)[:-1].gather(
            -1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)
    assert got.shape == (len(ids) - 1,)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


def test_score_cli_refuses_non_qwen3(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    out = subprocess.run([sys.executable, "-m", "top_rl.tools.score", "--model", str(tmp_path), "--input-ids", "1,2"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "not a dense Qwen3" in out.stderr


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shard", [None, 20_000])
def test_save_load_round_trip_exact(tmp_path, dtype, shard):
    model = tiny_model(dtype, seed=4, tied=False)
    save_model(model, tmp_path, max_shard_bytes=shard)
    assert (tmp_path / "model.safetensors.index.json").exists() == bool(shard)
    loaded = load_model(tmp_path)
    assert loaded.policy.compute == model.policy.compute
    for (n, a), (_, b) in zip(model.named_parameters(), loaded.named_parameters()):
        assert a.dtype == b.dtype and torch.equal(a, b), n
    assert not list(tmp_path.glob("*.tmp"))


def test_moe_config_refused():
    with pytest.raises(NotDenseQwen3, match="dense Qwen3"):
        Qwen3Config.from_hf_dict({"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]})
    with pytest.raises(NotDenseQwen3, match="rope scaling"):
        Qwen3Config.from_hf_dict({"model_type": "qwen3", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
                                  "num_hidden_layers": 1, "num_attention_heads": 1,
                                  "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
