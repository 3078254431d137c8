"""What the stand-in server answers because it runs SGLang 0.5.11's own request code (its FastAPI app,
TokenizerManager, io_struct dataclasses and SamplingParams), and how our client handles it. Each test pins a
behaviour the earlier hand-written stand-in got wrong (it answered 200/404 to wrong methods, took an int
weight_version, an unknown sampling key and top_p=0, ignored top_k, had another 400 body, always flushed,
read tensor entry 0 for every TP rank, and lacked several meta_info keys)."""

from __future__ import annotations

import threading
import time

import pytest
import requests
import torch

from tests import sglang_cpu
from tests.helpers import push_by_ipc, sglang_engine_config, tiny_model

from top_rl import contract, kernels  # noqa: E402
from top_rl.model import hf_state_dict, pack, save_model  # noqa: E402
from top_rl.weights.sglang_ipc import tensor_payload  # noqa: E402
from top_rl.rollout.sglang.engine import SglangEngine  # noqa: E402
from top_rl.rollout.sglang.client import SglangClient, SglangHTTPError, SglangUnavailable  # noqa: E402
from top_rl.rollout.sglang.config import SglangEngineConfig, TopConfigError  # noqa: E402
from top_rl.rollout.sglang.protocol import parse_scores, score_payload  # noqa: E402

V1 = contract.DEFAULT  # the contract these engines run under

_ERR = sglang_cpu.import_error()
pytestmark = pytest.mark.skipif(_ERR is not None, reason=_ERR or "")

# SGLang's TokenizerManager._handle_batch_output + add_logprob_to_meta_info, non-stream, skip_tokenizer_init
META_KEYS = {"id", "finish_reason", "prompt_tokens", "weight_version", sglang_cpu.RELEASE.retractions_key, "input_token_logprobs",
             "output_token_logprobs", "output_token_logprobs_length", "reasoning_tokens", "completion_tokens",
             "cached_tokens", "e2e_latency", "response_sent_to_client_ts"}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("proto")
    model = tiny_model()
    save_model(model, d)
    return d, model


@pytest.fixture(scope="module")
def server(ckpt):
    from tests.doubles.sglang_standin import StandinServer

    with StandinServer(str(ckpt[0])) as srv:
        yield srv


def _http():
    s = requests.Session()
    s.trust_env = False
    return s


def test_wrong_methods_get_405(server):
    http = _http()
    for method, path in [("GET", "/generate"), ("GET", "/update_weights_from_disk"), ("PUT", "/flush_cache"),
                         ("GET", "/init_weights_update_group"), ("POST", "/server_info"), ("POST", "/health")]:
        r = http.request(method, server.url + path)
        assert (r.status_code, r.json()) == (405, {"detail": "Method Not Allowed"}), (method, path)
    client = SglangClient(server.url)  # the methods the client uses are the routes' own
    client.flush_cache(0.0)
    assert client.server_info()["version"] == sglang_cpu.SGLANG_VERSION and client.health()


def test_int_weight_version_is_a_400_and_the_client_refuses_it(server, ckpt):
    r = _http().post(server.url + "/update_weights_from_disk", json={"model_path": str(ckpt[0]), "weight_version": 3})
    body = r.json()  # FastAPI validation error, re-shaped by SGLang's handler
    assert r.status_code == 400 and body["object"] == "error" and body["code"] == 400 and body["type"] == "Bad Request"
    assert "weight_version" in body["message"] and "valid string" in body["message"]
    client = SglangClient(server.url)
    with pytest.raises(SglangHTTPError, match="(?s)HTTP 400: .*weight_version.*valid string"):  # the message is read out
        client.request("POST", "/update_weights_from_disk", json={"model_path": str(ckpt[0]), "weight_version": 3})
    n = len(server.requests)
    with pytest.raises(TypeError, match="weight_version=3 must be a str"):
        client.update_weights_from_disk(str(ckpt[0]), weight_version=3)
    assert len(server.requests) == n  # refused before sending


def test_unknown_sampling_key_is_a_500(server):
    r = _http().post(server.url + "/generate", json={"input_ids": [5], "sampling_params": {"max_new_tokens": 1,
                                                                                            "bogus": 1}})
    assert (r.status_code, r.text) == (500, "Internal Server Error")  # SamplingParams(**kw): an uncaught TypeError
    with pytest.raises(TopConfigError, match=r"sampling keys \['bogus'\] are not checked"):  # the engine never sends it
        SglangEngine(sglang_engine_config(extra_sampling={"bogus": 1}), "fa3", top=V1)


def test_top_p_zero_is_a_400_with_sglangs_error_body(server):
    r = _http().post(server.url + "/generate", json={"input_ids": [5], "sampling_params": {"top_p": 0}})
    assert (r.status_code, r.json()) == (400, {"error": {"message": "top_p must be in (0, 1], got 0."}})
    n = len(server.requests)
    with pytest.raises(SglangHTTPError, match=r"HTTP 400: top_p must be in \(0, 1\], got 0\.$"):
        SglangClient(server.url, max_retries=3).generate({"input_ids": [5], "sampling_params": {"top_p": 0}})
    assert len(server.requests) == n + 1  # a 4xx is not retried


def _ranks(model, seq: list[int], start: int) -> list[int]:
    """Rank of each token seq[j], j >= start, in the sampler's distribution (T=1) after seq[:j]."""
    ids, pos, cu = pack([seq])
    lp = kernels.sampler_log_softmax(model(ids, pos, cu)[start - 1:-1], 1.0).float()
    chosen = lp.gather(1, torch.tensor(seq[start:])[:, None])
    return (lp > chosen).sum(1).tolist()


def test_top_k_restricts_the_draw_not_the_logprobs(server, ckpt):
    client, model = SglangClient(server.url), ckpt[1]
    prompts = [[5, 6, 7], [8, 9], [30, 31, 32, 33]]

    def run(extra):
        sp = [{"max_new_tokens": 12, "sampling_seed": 100 + i, "ignore_eos": True, **extra} for i in range(3)]
        return client.generate({"input_ids": prompts, "sampling_params": sp, "return_logprob": True})

    free, top2 = run({}), run({"top_k": 2})
    free_ranks = [r for p, o in zip(prompts, free) for r in _ranks(model, p + o["output_ids"], len(p))]
    assert max(free_ranks) >= 2  # without top_k some token falls outside the top 2: the check below can fail
    for p, o in zip(prompts, top2):
        assert max(_ranks(model, p + o["output_ids"], len(p))) <= 1
        seq = p + o["output_ids"]
        ids, pos, cu = pack([seq])
        lp = kernels.sampler_log_softmax(model(ids, pos, cu)[len(p) - 1:-1], 1.0)
        want = lp.gather(1, torch.tensor(o["output_ids"])[:, None])[:, 0].tolist()
        assert [t[0] for t in o["meta_info"]["output_token_logprobs"]] == want  # full-vocab log-probs, not renormed


def test_flush_cache_is_refused_while_a_request_runs(server):
    client, sched = SglangClient(server.url, max_retries=0), server.scheduler
    sched.hold.clear()
    t = threading.Thread(target=client.generate, args=({"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}},))
    try:
        t.start()
        deadline = time.monotonic() + 30
        while sched.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(SglangHTTPError, match="POST /flush_cache .*HTTP 400: Flush cache failed"):
            client.flush_cache(0.0)
        threading.Timer(0.3, sched.hold.set).start()
        client.flush_cache(timeout_s=30.0)  # waits for the running request, then flushes
    finally:
        sched.hold.set()
        t.join()
    assert sched.in_flight == 0


def test_meta_info_and_a_prefill_only_answer(server):
    raw = SglangClient(server.url).generate(score_payload([[4, 5, 6]], [[7, 8]]))
    meta = raw[0]["meta_info"]
    assert set(meta) == META_KEYS
    assert raw[0]["output_ids"] == [] and meta["finish_reason"] == {"type": "length", "length": 0}
    # an all-prefill-only batch runs no sampler (tp_worker.py:500-522): no output log-prob entry
    assert meta["output_token_logprobs"] == [] and meta["output_token_logprobs_length"] == 0
    assert parse_scores(raw[0], 0, [4, 5, 6], [7, 8]) == [t[0] for t in meta["input_token_logprobs"][1:]]
    # batched with a sampling request, the sampler runs on its row and SGLang sends one entry (logprob_end =
    # max(len(output_ids), 1), scheduler_output_processor_mixin.py:1085): the client reads input_token_logprobs only
    mixed = {**raw[0], "meta_info": {**meta, "output_token_logprobs": [[-3.5, 0, None]], "output_token_logprobs_length": 1}}
    assert parse_scores(mixed, 0, [4, 5, 6], [7, 8]) == parse_scores(raw[0], 0, [4, 5, 6], [7, 8])


def test_tensor_sync_reads_each_tp_ranks_entry(ckpt, monkeypatch):
    from tests.doubles.sglang_standin import StandinServer

    with StandinServer(str(ckpt[0]), server_args={"tp_size": 2}) as srv:
        cfg = SglangEngineConfig(model_path=str(ckpt[0]), attention_backend="fa3", logprob_source="prefill", top=False,
                                 port=srv.port, tp_size=2, flattened_buckets=False)
        eng = SglangEngine(cfg, "fa3", top=V1)
        other = hf_state_dict(tiny_model(seed=4))
        push_by_ipc(monkeypatch, eng, other, 1, 1 << 20)  # one entry per TP rank: both ranks deserialize theirs
        assert torch.equal(srv.scheduler.model.norm, other["model.norm.weight"])
    # a payload entry can be deserialized once (it carries shared-memory handles): build one per request
        norm = other["model.norm.weight"]
        one = lambda t: tensor_payload([("model.norm.weight", t)], 1, False)[0]  # noqa: E731
        client = SglangClient(srv.url)
        with pytest.raises(SglangHTTPError, match=r"1 entries for tp_size=2: TP rank 1 reads entry \[1\]"):
            client.update_weights_from_tensor(one(norm))
        with pytest.raises(SglangHTTPError, match=r"TP rank 1 received other tensors .*serialized_named_tensors\[1\]"):
            client.update_weights_from_tensor(one(norm) + one(norm + 1))
    with pytest.raises(SglangUnavailable):  # the server is gone
        SglangClient(srv.url, max_retries=0).server_info()
