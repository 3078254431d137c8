"""`top-rl-parity-probe` against the in-thread STAND-IN server (tests/doubles/sglang_standin.py, not SGLang): the
stand-in (SGLang's HTTP app and tokenizer manager, a stand-in scheduler) computes with TOP-RL's own model, so the probe must report bitwise equality for the same checkpoint and
name the first differing token for another one. On a GPU cluster the same command runs against a real server."""

from __future__ import annotations

import json

import pytest
import torch

from tests import sglang_cpu
from tests.helpers import tiny_model

from top_rl.model import save_model
from top_rl.tools.parity_probe import compare, main
from tests.doubles.sglang_standin import StandinServer

_ERR = sglang_cpu.import_error()
needs_sglang = pytest.mark.skipif(_ERR is not None, reason=_ERR or "")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    model = tiny_model(dtype="bfloat16")
    save_model(model, root / "a")
    with torch.no_grad():
        model.norm[3] += 0.25  # one fp32 weight differs: every log-prob moves
    save_model(model, root / "b")
    return root


@pytest.fixture(scope="module")
def server(ckpts):
    with StandinServer(str(ckpts / "a")) as srv:
        yield srv


def _run(capsys, **keys):
    rc = main([f"{k}={v}" for k, v in keys.items()])
    out = capsys.readouterr()
    return rc, json.loads(out.out), out.err


@needs_sglang
def test_same_checkpoint_is_bitwise_equal(server, ckpts, capsys, tmp_path):
    rc, rep, err = _run(capsys, url=server.url, model=ckpts / "a", num_prompts=3, prompt_len=5,
                        max_new_tokens=6, temperature=0.7, out=tmp_path / "r.json")
    assert rc == 0, err
    assert rep["bitwise_equal"] and rep["server_contract_violations"] == [] and rep["dtype"] == "bfloat16"
    for src in ("prefill", "decode"):
        r = rep["sources"][src]
        assert r["first_diff"] is None and r["equal_fraction"] == 1.0 and r["abs_diff"] == 0.0 and r["tokens"] > 0
    assert json.loads((tmp_path / "r.json").read_text()) == rep
    assert "prefill:" in err and "all equal" in err


@needs_sglang
def test_other_weights_name_the_first_difference(server, ckpts, capsys):
    rc, rep, err = _run(capsys, url=server.url, model=ckpts / "b", num_prompts=2, prompt_len=4, max_new_tokens=3)
    assert rc == 1
    fd = rep["sources"]["prefill"]["first_diff"]
    assert (fd["sample"], fd["position"], fd["absolute_position"]) == (0, 0, 4)
    assert fd["engine"] != fd["trainer"] and rep["sources"]["prefill"]["abs_diff"] > 0
    assert "first difference: sample 0 position 0" in err


@needs_sglang
def test_rescore_pairs_from_a_file(server, ckpts, capsys, tmp_path):
    f = tmp_path / "pairs.jsonl"
    f.write_text(json.dumps({"prompt_ids": [4, 5, 6], "response_ids": [7, 8, 95]}) + "\n"
                 + json.dumps({"prompt_ids": [9], "response_ids": [10]}) + "\n\n")
    rc, rep, _ = _run(capsys, url=server.url, model=ckpts / "a", prompts=f, source="prefill")
    assert rc == 0 and set(rep["sources"]) == {"prefill"} and rep["sources"]["prefill"]["tokens"] == 4
    f.write_text("[1, 2]\n{oops\n")
    rc = main([f"url={server.url}", f"model={ckpts / 'a'}", f"prompts={f}"])
    assert rc == 2 and "pairs.jsonl:2: invalid JSON" in capsys.readouterr().err


@needs_sglang
def test_server_off_contract_and_unreachable(ckpts, capsys):
    # SGLang's ServerArgs turns deterministic inference on whenever rl_on_policy_target is set: both are off here
    off = {"enable_deterministic_inference": False, "rl_on_policy_target": None}
    with StandinServer(str(ckpts / "a"), server_args=off) as srv:
        rc, rep, err = _run(capsys, url=srv.url, model=ckpts / "a", num_prompts=1, max_new_tokens=2)
        assert rc == 3 and rep["bitwise_equal"]
        assert rep["server_contract_violations"] == ["enable_deterministic_inference=False (TOP needs True)",
                                                     "rl_on_policy_target=None (TOP needs 'fsdp')"]
        rc, _, _ = _run(capsys, url=srv.url, model=ckpts / "a", num_prompts=1, max_new_tokens=2,
                        server_check="false")
        assert rc == 0
    assert main(["url=http://127.0.0.1:9", f"model={ckpts / 'a'}", "timeout=2"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_compare_counts_non_finite_as_a_difference():
    r = compare([[1, 2]], [[3, 4]], [[-1.0, float("nan")]], [[-1.0, float("nan")]])
    assert not r["bitwise_equal"] and r["first_diff"]["position"] == 1 and r["abs_diff"] == "inf"
    r = compare([[1], [1]], [[3], [4, 5]], [[-1.0], [-2.0, -0.5]], [[-1.0], [-2.0, -0.75]])
    assert r["abs_diff"] == pytest.approx(0.0625) and r["equal_fraction"] == 2 / 3  # mean of per-sample means
