"""Request bodies and response parsing of SGLang 0.5.11's /generate (docs/numerics.md §6.1, §8).

Generation: a batch `input_ids` list with one sampling_params dict per sample (its own `sampling_seed`),
`return_logprob`, `logprob_start_len = -1` (output tokens only). With `--skip-tokenizer-init` each answer is
{"output_ids", "meta_info"}; `meta_info.output_token_logprobs[j] = [logprob, output_ids[j], null]`.

Prefill re-scoring of prompt P (length p) + response R: `input_ids = P + R`, `max_new_tokens = 0`,
`logprob_start_len = p - 1`. The server answers `input_token_logprobs` with |R| + 1 entries:
entry 0 is `[null, P[-1], null]` (the scheduler prepends None and drops the last row), entry j >= 1 is
`[log p(R[j-1] | P + R[:j-1]), R[j-1], null]` (fp32, no temperature). So the response's scores are entries 1..|R|.
Quirk of the pinned scheduler: a reported input token id >= vocab_size - 1 is replaced by 0.

orjson writes NaN/inf as null: a null log-prob past entry 0 is returned as NaN, so the parity gate counts it as a
violation instead of a missing number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from top_rl.rollout.sglang.client import SglangHTTPError, SglangProtocolError
from top_rl.sglang_release import RELEASES

_RETRACTIONS = tuple(dict.fromkeys(r.retractions_key for r in RELEASES.values()))  # the key each release names it by

GENERATE = "POST /generate"


def generate_payload(prompts: list[list[int]], seeds: list[int], sampling: dict) -> dict:
    return {
        "input_ids": [[int(t) for t in p] for p in prompts],
        "sampling_params": [{**sampling, "sampling_seed": int(s)} for s in seeds],
        "return_logprob": True,
        "logprob_start_len": -1,
    }


def score_payload(prompts: list[list[int]], responses: list[list[int]]) -> dict:
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {i} is empty: re-scoring needs at least one prompt token as context")
    return {
        "input_ids": [[int(t) for t in p] + [int(t) for t in r] for p, r in zip(prompts, responses)],
        "sampling_params": [{"max_new_tokens": 0} for _ in prompts],
        "return_logprob": True,
        "logprob_start_len": [len(p) - 1 for p in prompts],
    }


@dataclass
class Generation:
    output_ids: list[int]
    logprobs: list[float]  # output_token_logprobs values: the sampler's (§6.2)
    finish_reason: str  # "stop" | "length"
    meta: dict = field(default_factory=dict)


def _fail(msg: str) -> SglangProtocolError:
    return SglangProtocolError(f"{GENERATE}: {msg}", GENERATE)


def items(resp: Any, n: int) -> list[dict]:
    """The per-sample answers of a batch request, in request order."""
    if isinstance(resp, dict) and n == 1:
        resp = [resp]
    if not isinstance(resp, list) or len(resp) != n or not all(isinstance(x, dict) for x in resp):
        got = f"a list of {len(resp)}" if isinstance(resp, list) else type(resp).__name__
        raise _fail(f"expected a list of {n} objects for a batch of {n}, got {got}")
    return resp


def _meta(item: dict, i: int) -> dict:
    meta = item.get("meta_info")
    if not isinstance(meta, dict):
        raise _fail(f"sample {i}: no meta_info object")
    fr = meta.get("finish_reason")
    if isinstance(fr, dict) and fr.get("type") == "abort":
        raise SglangHTTPError(f"{GENERATE}: sample {i} was aborted by the server: {fr.get('message')}", GENERATE)
    return meta


def _value(v: Any, i: int, j: int, key: str) -> float:
    if v is None:
        return math.nan  # orjson's null for a non-finite value
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _fail(f"sample {i}: {key}[{j}][0] = {v!r} is not a number")
    return float(v)


def _triples(meta: dict, key: str, i: int) -> list:
    t = meta.get(key)
    if not isinstance(t, list) or not all(isinstance(x, (list, tuple)) and len(x) >= 2 for x in t):
        raise _fail(f"sample {i}: meta_info.{key} is not a list of [logprob, token_id, text] triples "
                    f"(was return_logprob sent?)")
    return t


def same_token(reported: Any, expected: int, vocab_size: int | None) -> bool:
    if reported == expected:
        return True
    return reported == 0 and vocab_size is not None and expected >= vocab_size - 1


def parse_generation(item: dict, i: int) -> Generation:
    meta = _meta(item, i)
    out = item.get("output_ids")
    if not isinstance(out, list) or not all(isinstance(t, int) for t in out):
        raise _fail(f"sample {i}: output_ids missing or not a list of ints (is --skip-tokenizer-init set?)")
    trip = _triples(meta, "output_token_logprobs", i)
    if len(trip) != len(out):
        raise _fail(f"sample {i}: {len(trip)} output_token_logprobs for {len(out)} output_ids")
    for j, (t, tok) in enumerate(zip(trip, out)):
        if t[1] != tok:
            raise _fail(f"sample {i}: output_token_logprobs[{j}] is for token {t[1]}, output_ids[{j}] = {tok}")
    fr = meta.get("finish_reason")
    kind = fr.get("type") if isinstance(fr, dict) else None
    if kind not in ("stop", "length"):
        raise _fail(f"sample {i}: finish_reason {fr!r} is not a stop/length object")
    info = {k: meta[k] for k in ("weight_version", "prompt_tokens", "completion_tokens", "cached_tokens",
                                 "id", *_RETRACTIONS) if k in meta}
    info["finish_reason"] = fr
    return Generation(list(out), [_value(t[0], i, j, "output_token_logprobs") for j, t in enumerate(trip)], kind, info)


def parse_scores(item: dict, i: int, prompt: list[int], response: list[int], vocab_size: int | None = None) -> list[float]:
    """Entries 1..|R| of input_token_logprobs, checked token by token against the response."""
    meta = _meta(item, i)
    trip = _triples(meta, "input_token_logprobs", i)
    if len(trip) != len(response) + 1:
        raise _fail(f"sample {i}: {len(trip)} input_token_logprobs for a {len(response)}-token response re-scored from "
                    f"logprob_start_len={len(prompt) - 1} (expected {len(response) + 1}: a leading null, then one per token)")
    if trip[0][0] is not None or not same_token(trip[0][1], prompt[-1], vocab_size):
        raise _fail(f"sample {i}: input_token_logprobs[0] = {trip[0][:2]}, expected [null, {prompt[-1]}] "
                    f"(the last prompt token has no score)")
    for j, tok in enumerate(response, 1):
        if not same_token(trip[j][1], tok, vocab_size):
            raise _fail(f"sample {i}: input_token_logprobs[{j}] is for token {trip[j][1]}, response[{j - 1}] = {tok}")
    return [_value(trip[j][0], i, j, "input_token_logprobs") for j in range(1, len(response) + 1)]
