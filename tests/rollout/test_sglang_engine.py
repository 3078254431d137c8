"""The SGLang engine's HTTP client against a local STAND-IN server (tests/doubles/sglang_standin.py: SGLang
0.5.11's own HTTP app and tokenizer manager on 127.0.0.1, in front of a stand-in scheduler that computes with
TOP-RL's model). Not a whole SGLang: what this proves is the protocol handling (payloads, the input_token_logprobs
off-by-one, errors, retries, weight versions) against SGLang's request/response code, with exact equality of the
numbers. tests/rollout/test_sglang_standin_protocol.py checks the behaviours that come from SGLang's own code.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests import sglang_cpu
from tests.helpers import tiny_model

from top_rl import contract  # noqa: E402
from top_rl.model import save_model, sequence_logprobs  # noqa: E402
from top_rl.engine.interface import SamplingParams  # noqa: E402
from top_rl.rollout.native.engine import NativeEngine  # noqa: E402
from top_rl.rollout.sglang.engine import SglangEngine  # noqa: E402
from top_rl.rollout.sglang.client import (SglangClient, SglangHTTPError, SglangProtocolError,  # noqa: E402
                                          SglangUnavailable)
from top_rl.rollout.sglang.config import SglangEngineConfig  # noqa: E402
from top_rl.rollout.sglang.protocol import parse_generation, parse_scores, score_payload  # noqa: E402
from tests.doubles.sglang_standin import StandinServer  # noqa: E402

_ERR = sglang_cpu.import_error()
pytestmark = pytest.mark.skipif(_ERR is not None, reason=_ERR or "")
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [20]]
SEEDS = [11, 12, 13]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    model = tiny_model()
    save_model(model, d)
    return d, model


@pytest.fixture
def server(ckpt):
    with StandinServer(str(ckpt[0])) as srv:
        yield srv


def _engine(server, ckpt, tmp_path=None, **kw) -> SglangEngine:
    run = {"attention_backend": "fa3", "logprob_source": "prefill", "top": True}  # what the engine takes from the run
    cfg = SglangEngineConfig(model_path=str(ckpt[0]), port=server.port, retry_backoff_s=0.01,
                             weights_dir=str(tmp_path or ""), **{**run, **kw})
    # `decode` needs a backend proven decode == extend; the stand-in computes both with the reference kernels, so
    # these protocol tests use a contract in which fa3 is proven (both releases prove fa3 only)
    top = dataclasses.replace(sglang_cpu.CONTRACT, decode_equals_extend=(cfg.attention_backend,))
    return SglangEngine(cfg, cfg.attention_backend, top=top)


# ------------------------------------------------------------------------------------ numbers
@pytest.mark.parametrize("source, temperature", [("prefill", 1.0), ("decode", 1.0), ("prefill", 0.7), ("decode", 0.7)])
def test_generate_equals_the_native_engine(server, ckpt, source, temperature):
    eng = _engine(server, ckpt, logprob_source=source)
    params = SamplingParams(max_new_tokens=7, temperature=temperature)
    got = eng.generate(PROMPTS, SEEDS, params)
    want = NativeEngine(ckpt[1], source).generate(PROMPTS, SEEDS, params)
    for g, w in zip(got, want):
        assert (g.prompt_ids, g.response_ids, g.finish_reason, g.seed) == (w.prompt_ids, w.response_ids, w.finish_reason, w.seed)
        assert g.logprobs == w.logprobs and g.sample_logprobs == w.sample_logprobs  # exact, not close
    assert got[0].meta["finish_reason"]["type"] == got[0].finish_reason


def test_request_shapes(server, ckpt):
    eng = _engine(server, ckpt)
    eng.generate(PROMPTS, SEEDS, SamplingParams(max_new_tokens=4, temperature=0.9, stop_token_ids=(3,)))
    (_, gen), (_, score) = [(p, b) for p, b in server.requests if p == "/generate"]
    assert gen["input_ids"] == PROMPTS and gen["return_logprob"] is True and gen["logprob_start_len"] == -1
    assert [sp["sampling_seed"] for sp in gen["sampling_params"]] == SEEDS  # one distinct seed per sample
    assert all(sp == {"max_new_tokens": 4, "temperature": 0.9, "stop_token_ids": [3], "sampling_seed": s}
               for sp, s in zip(gen["sampling_params"], SEEDS))
    # prefill re-scoring: prompt + response, no new tokens, logprob_start_len = len(prompt) - 1
    assert score["logprob_start_len"] == [len(p) - 1 for p in PROMPTS]
    assert all(sp == {"max_new_tokens": 0} for sp in score["sampling_params"])
    assert [ids[:len(p)] for ids, p in zip(score["input_ids"], PROMPTS)] == PROMPTS


def test_score_off_by_one_against_the_model(server, ckpt):
    """Entries 1..|R| of input_token_logprobs are log p(R[j] | P + R[:j]): checked against the model directly."""
    eng = _engine(server, ckpt)
    responses = [[40, 41], [42], []]
    got = eng.score(PROMPTS, responses)
    for p, r, g in zip(PROMPTS, responses, got):
        want = sequence_logprobs(ckpt[1], [p + r], [len(p)])[0].tolist() if r else []
        assert g == want
    # the raw answer: a leading null for the last prompt token, then one entry per response token
    raw = SglangClient(server.url).generate(score_payload([PROMPTS[0]], [responses[0]]))[0]
    trip = raw["meta_info"]["input_token_logprobs"]
    assert [t[1] for t in trip] == [PROMPTS[0][-1]] + responses[0] and trip[0][0] is None and raw["output_ids"] == []


def _item(trip_in=None, out_ids=(), trip_out=(), fr=None):
    meta = {"finish_reason": fr or {"type": "length", "length": len(out_ids)}, "weight_version": "default"}
    if trip_in is not None:
        meta["input_token_logprobs"] = trip_in
    meta["output_token_logprobs"] = list(trip_out)
    return {"output_ids": list(out_ids), "meta_info": meta}


def test_parse_scores_rules():
    p, r = [7, 8], [9, 95]
    assert parse_scores(_item([[None, 8, None], [-1.5, 9, None], [-2.0, 95, None]]), 0, p, r) == [-1.5, -2.0]
    # the pinned scheduler reports ids >= vocab_size - 1 as 0: accepted only when the vocabulary is known
    quirk = _item([[None, 8, None], [-1.5, 9, None], [-2.0, 0, None]])
    assert parse_scores(quirk, 0, p, r, vocab_size=96) == [-1.5, -2.0]
    with pytest.raises(SglangProtocolError, match="is for token 0"):
        parse_scores(quirk, 0, p, r)
    nan = parse_scores(_item([[None, 8, None], [None, 9, None], [-2.0, 95, None]]), 0, p, r)
    assert nan[0] != nan[0] and nan[1] == -2.0  # orjson's null for a non-finite value becomes NaN, never 0
    for bad, msg in [([[None, 8, None], [-1.5, 9, None]], "2 input_token_logprobs for a 2-token"),
                     ([[-0.1, 8, None], [-1.5, 9, None], [-2.0, 95, None]], "expected \\[null, 8\\]"),
                     ([[None, 8, None], [-1.5, 10, None], [-2.0, 95, None]], "is for token 10"),
                     ([[None, 8, None], ["x", 9, None], [-2.0, 95, None]], "not a number")]:
        with pytest.raises(SglangProtocolError, match=f"POST /generate: sample 0: .*{msg}"):
            parse_scores(_item(bad), 0, p, r)
    with pytest.raises(SglangProtocolError, match="return_logprob"):
        parse_scores(_item(None), 0, p, r)


def test_parse_generation_rules():
    g = parse_generation(_item(out_ids=[4, 2], trip_out=[[-0.5, 4, None], [-0.25, 2, None]],
                               fr={"type": "stop", "matched": 2}), 0)
    assert (g.output_ids, g.logprobs, g.finish_reason) == ([4, 2], [-0.5, -0.25], "stop")
    with pytest.raises(SglangHTTPError, match="sample 3 was aborted by the server: out of memory"):
        parse_generation(_item(fr={"type": "abort", "message": "out of memory"}), 3)
    with pytest.raises(SglangProtocolError, match="1 output_token_logprobs for 2 output_ids"):
        parse_generation(_item(out_ids=[4, 2], trip_out=[[-0.5, 4, None]]), 0)
    with pytest.raises(SglangProtocolError, match="skip-tokenizer-init"):
        parse_generation({"text": "hi", "meta_info": {"finish_reason": {"type": "length"}}}, 0)


# ------------------------------------------------------------------------------------ failures
def test_500_once_is_retried(server, ckpt):
    eng = _engine(server, ckpt)
    want = eng.generate(PROMPTS, SEEDS, SamplingParams(max_new_tokens=3))
    server.faults.append(("/generate", 500, b"Internal Server Error"))
    server.faults.append(("/generate", 0, b""))  # then a dropped connection: retried as well
    assert [s.logprobs for s in eng.generate(PROMPTS, SEEDS, SamplingParams(max_new_tokens=3))] == \
        [s.logprobs for s in want]
    assert not server.faults


def test_retries_are_bounded_and_only_for_idempotent_calls(server, ckpt):
    client = SglangClient(server.url, max_retries=2, backoff_s=0.01)
    server.faults.extend([("/generate", 503, b"busy")] * 3)
    with pytest.raises(SglangUnavailable, match="POST /generate .*HTTP 503: busy \\(after 3 attempts\\)"):
        client.generate({"input_ids": [[5]], "sampling_params": [{"max_new_tokens": 1}]})
    server.faults.append(("/update_weights_from_distributed", 500, b"boom"))
    with pytest.raises(SglangUnavailable, match="HTTP 500"):  # a broadcast is never retried blindly
        client.update_weights_from_distributed(["x"], ["float32"], [[1]], "g")
    assert not server.faults


def test_garbage_json_names_the_endpoint(server, ckpt):
    eng = _engine(server, ckpt)
    server.faults.append(("/generate", 200, b"<html>proxy error</html>"))
    with pytest.raises(SglangProtocolError, match="POST /generate at http://127.0.0.1:\\d+ returned invalid JSON.*proxy error"):
        eng.generate(PROMPTS, SEEDS, SamplingParams(max_new_tokens=2))
    server.faults.append(("/generate", 200, b'[{"output_ids": [1]}]'))
    with pytest.raises(SglangProtocolError, match="POST /generate: expected a list of 3 objects"):
        eng.generate(PROMPTS, SEEDS, SamplingParams(max_new_tokens=2))
    server.faults.append(("/generate", 200, b'{"output_ids": [1]}'))
    with pytest.raises(SglangProtocolError, match="sample 0: no meta_info"):
        eng.generate([[5]], [1], SamplingParams(max_new_tokens=2))
    server.faults.append(("/server_info", 200, b"[1, 2]"))
    with pytest.raises(SglangProtocolError, match="GET /server_info"):
        eng.verify_server()


def test_a_4xx_is_not_retried_and_carries_the_servers_message(server):
    client = SglangClient(server.url, max_retries=3, backoff_s=0.01)
    with pytest.raises(SglangHTTPError, match=r"HTTP 400: top_p must be in \(0, 1\], got 0"):  # SamplingParams.verify
        client.generate({"input_ids": [[5]], "sampling_params": [{"max_new_tokens": 1, "top_p": 0}]})
    assert sum(p == "/generate" for p, _ in server.requests) == 1
    with pytest.raises(SglangHTTPError, match="update_weights_from_disk .*HTTP 400: .*model_path '/nope'"):
        client.update_weights_from_disk("/nope")


def test_a_read_timeout_is_not_retried(server):
    client = SglangClient(server.url, timeout_s=0.3, max_retries=3, backoff_s=0.01)
    server.faults.append(("/generate", -1, b"1.0"))  # the server answers after 1 s
    with pytest.raises(SglangUnavailable, match="no answer within 0.3s .*request_timeout_s"):
        client.generate({"input_ids": [[5]], "sampling_params": [{"max_new_tokens": 1}]})
    assert not server.faults


def test_unreachable_server():
    client = SglangClient("http://127.0.0.1:9", max_retries=1, backoff_s=0.01)
    assert client.health(timeout=1) is False
    with pytest.raises(SglangUnavailable, match="no answer .*after 2 attempts"):
        client.generate({"input_ids": [[1]]})


def test_server_check(ckpt):
    with StandinServer(str(ckpt[0]), server_args={"rl_on_policy_target": None, "attention_backend": "triton"}) as srv:
        eng = _engine(srv, ckpt)
        with pytest.raises(Exception, match="rl_on_policy_target=None.*need 'fsdp'") as e:
            eng.verify_server()
        assert "attention_backend='triton' (need 'fa3')" in str(e.value)
    with StandinServer(str(ckpt[0])) as srv:
        assert _engine(srv, ckpt).verify_server()["version"] == sglang_cpu.SGLANG_VERSION


# ------------------------------------------------------------------------------------ weights (disk)
def test_disk_sync_versions_and_stale_server(server, ckpt, tmp_path):
    eng = _engine(server, ckpt, tmp_path, keep_weight_versions=2)
    other = tiny_model(seed=1)
    from top_rl.model import hf_state_dict
    for _ in range(3):
        eng.load_named_tensors(hf_state_dict(other))
    assert sorted(p.name for p in tmp_path.glob("v*")) == ["v000002", "v000003"]  # older versions removed
    assert (tmp_path / "v000003" / "config.json").is_file()
    params = SamplingParams(max_new_tokens=5, temperature=0.8)
    got = eng.generate(PROMPTS, SEEDS, params)
    want = NativeEngine(other).generate(PROMPTS, SEEDS, params)
    assert [g.logprobs for g in got] == [w.logprobs for w in want] and got[0].meta["weight_version"] == "3"
    paths = [p for p, _ in server.requests]
    assert paths.count("/update_weights_from_disk") == 3 and "/flush_cache" in paths
    body = [b for p, b in server.requests if p == "/update_weights_from_disk"][-1]
    assert body == {"model_path": str(tmp_path / "v000003"), "flush_cache": True, "weight_version": "3",
                    "torch_empty_cache": True}  # 0.5.11 frees the CUDA cache after a flush only when asked
    # as if the server restarted with its initial weights (0.5.17's ServerArgs are read-only: its own update path)
    if sglang_cpu.RELEASE.global_args == "module_global":
        server.server_args.weight_version = "default"
    else:
        server.tokenizer_manager._update_weight_version_if_provided("default")
    with pytest.raises(SglangProtocolError, match="weight_version 'default', expected '3'"):
        eng.generate(PROMPTS, SEEDS, params)


def test_disk_sync_keeps_fp32_norms_exact(server, ckpt, tmp_path):
    """§3: norm weights and the embedding travel as fp32; the written checkpoint keeps their dtype and bits."""
    from safetensors.torch import load_file

    from top_rl.model import hf_state_dict
    eng = _engine(server, ckpt, tmp_path)
    sd = hf_state_dict(tiny_model(dtype="bfloat16", seed=2))
    eng.load_named_tensors(sd)
    back = load_file(str(tmp_path / "v000001" / "model.safetensors"))
    assert back["model.norm.weight"].dtype == torch.float32 and back["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
    assert all(torch.equal(back[k], v) for k, v in sd.items())
