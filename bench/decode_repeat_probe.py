"""Issue 30 item 12's probe (GPU): does the native engine's eager decode repeat bitwise, and what changed when it
does not? The order of tests/gpu/test_native_decode.py, in one fresh process: eager batch 64 (E1), a CUDA-graph call
of 8 (G8), eager batch 64 again (E2, E3). After each call it records the kernel paths and fallbacks
(top_rl.kernels.report()) and torch.compile's counters, and prints how many sampler log-probs each call differs from
the others in (tokens too), so a first-use compile, a fallback or a graph capture shows up beside the difference.

    python bench/decode_repeat_probe.py            (on the H200: PYTHONPATH as scripts/gpu_run.sh sets it)
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.gpu._common import device_model  # noqa: E402
from top_rl import kernels  # noqa: E402
from top_rl.rollout.base import SamplingParams  # noqa: E402
from top_rl.rollout.native import NativeEngine  # noqa: E402

VOCAB, N, NEW = 151936, 64, 40


def _counters() -> dict:
    from torch._dynamo.utils import counters

    return {k: dict(v) for k, v in counters.items() if k in ("stats", "frames", "recompiles", "unimplemented")}


def _diff(a, b) -> tuple[int, int]:
    """(rows whose tokens differ, sampler log-prob positions that differ) between two calls' samples."""
    tokens = sum(x.response_ids != y.response_ids for x, y in zip(a, b))
    lps = sum(int((torch.tensor(x.sample_logprobs) != torch.tensor(y.sample_logprobs)).sum()) for x, y in zip(a, b))
    return tokens, lps


def main() -> None:
    print("[probe] building the model", flush=True)
    model = device_model(seed=1, vocab_size=VOCAB)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.choice([1, 5, 64, 130, 300]))] for _ in range(N)]
    seeds = [rng.randrange(2**63) for _ in range(N)]
    params = SamplingParams(max_new_tokens=NEW, temperature=0.9)
    calls, records = {}, []
    for name, n, graphs in (("E1", N, False), ("G8", 8, True), ("E2", N, False), ("E3", N, False), ("G64", N, True)):
        calls[name] = NativeEngine(model, "decode", eos_token_id=-1, cuda_graphs=graphs).generate(
            prompts[:n], seeds[:n], params)
        rep = kernels.report()
        records.append({"call": name, "paths": rep["paths"], "fallbacks": rep["fallbacks"], "compile": _counters()})
        print(f"[probe] {name} done: {json.dumps(records[-1], default=str)}", flush=True)  # a timeout keeps these
    print("### eager decode repeat probe (tokens differing rows / sampler log-prob positions differing of "
          f"{N * NEW})\n\n| call | vs E1 | vs E2 | vs E3 |\n|---|---|---|---|")
    for name in ("E1", "E2", "E3", "G64"):
        print(f"| {name} | " + " | ".join("%d / %d" % _diff(calls[name], calls[o]) for o in ("E1", "E2", "E3")) + " |")
    print("\nper call: kernel paths, fallbacks, torch.compile counters")
    prev = None
    for r in records:
        changed = {k: v for k, v in r.items() if prev is None or prev.get(k) != v}
        print(json.dumps(changed, default=str))
        prev = r
    first = next(i for i, (x, y) in enumerate(zip(calls["E1"], calls["E2"])) if x.sample_logprobs != y.sample_logprobs) \
        if _diff(calls["E1"], calls["E2"])[1] else None
    if first is not None:
        a, b = torch.tensor(calls["E1"][first].sample_logprobs), torch.tensor(calls["E2"][first].sample_logprobs)
        pos = (a != b).nonzero().flatten().tolist()
        print(f"\nE1 vs E2, sample {first} (prompt length {len(prompts[first])}): positions {pos}, "
              f"E1 {a[pos].tolist()}, E2 {b[pos].tolist()}")


if __name__ == "__main__":
    main()
