"""Issue 30 item 12's probe (GPU): does the native engine's eager decode repeat bitwise, and what changed when it
does not? The order of tests/gpu/test_native_decode.py, in one fresh process: eager batch 64 (E1), a CUDA-graph call
of 8 (G8), eager batch 64 again (E2, E3). After each call it records the kernel paths and fallbacks
(top_rl.kernels.report()) and torch.compile's counters, and prints how many sampler log-probs each call differs from
the others in (tokens too), so a first-use compile, a fallback or a graph capture shows up beside the difference.

    python bench/decode_repeat_probe.py            (on the H200: PYTHONPATH as scripts/gpu_run.sh sets it)
    python bench/decode_repeat_probe.py --poison   (the same calls after filling the allocator's free memory with
                                                    0, NaN or 1e4: outputs that change with it read memory nobody
                                                    wrote; then the first layer whose prefill output changes)

Session 10 saw the first eager call after a graph capture differ from every later call, all of which agree: the
signature of a read of uninitialised memory (a call sees what the previous, different computation left behind).
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


def poison(value: float) -> None:
    """Fill most of the GPU's free memory with `value` and free it into the caching allocator, so the next
    torch.empty calls return memory holding `value`."""
    if not torch.cuda.is_available():  # --cpu-smoke: nothing to poison
        return
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    blocks = []
    for size in (1 << 30, 256 << 20, 64 << 20, 16 << 20, 4 << 20, 1 << 20, 256 << 10):
        while free > (4 << 30) and len(blocks) < 4096:
            try:
                blocks.append(torch.full((size // 4,), value, dtype=torch.float32, device="cuda"))
            except torch.OutOfMemoryError:
                break
            free -= size
    torch.cuda.synchronize()
    del blocks  # back to the cache, contents kept


def layer_outputs(model, fn) -> list[tuple[str, torch.Tensor]]:
    """Every decoder layer's outputs (and the final logits) while `fn()` runs, in execution order."""
    seen, hooks = [], []
    for i, layer in enumerate(model.layers):
        hooks.append(layer.register_forward_hook(
            lambda _m, _a, out, i=i: seen.append((f"layer {i}", torch.cat([o.float().flatten() for o in out]).cpu()))))
    try:
        logits = fn()
    finally:
        for h in hooks:
            h.remove()
    return seen + [("logits", logits.float().flatten().cpu())]


def poison_main(model, prompts, seeds, params) -> None:
    engine = NativeEngine(model, "decode", eos_token_id=-1, cuda_graphs=False)

    def prefill():
        with torch.no_grad():
            cache = model.new_kv_cache(len(prompts), max(map(len, prompts)) + NEW)
            return engine._prefill(prompts, cache, model.lm_head_weight())

    base = None
    # 0 first (the base), NaN next (a read of unwritten memory shows as NaNs), 0 again (the repeat), then 1e4;
    # each row is printed as soon as its run is done, so a call's time limit keeps the rows before it
    for value in (0.0, float("nan"), 0.0, 1e4):
        poison(value)
        outs = layer_outputs(model, prefill)
        poison(value)
        gen = engine.generate(prompts, seeds, params)
        print(f"[probe] poisoned with {value}: prefill and generate done", flush=True)
        if base is None:
            base = (outs, gen)
            print("\n### poisoned free memory: prefill layer outputs and generate against the first 0-poisoned run\n")
            print("| poison | first prefill output that differs | max abs diff there | NaNs in logits | generate: "
                  "token rows / log-prob positions differing |\n|---|---|---|---|---|", flush=True)
            continue
        first = next(((name, (a - b).abs().nan_to_num(float("inf")).max().item())
                      for (name, a), (_, b) in zip(outs, base[0]) if not torch.equal(a, b)), ("none", 0.0))
        nans = int(outs[-1][1].isnan().sum())
        print(f"| {value} | {first[0]} | {first[1]:.3g} | {nans} | %d / %d |" % _diff(gen, base[1]), flush=True)


def main() -> None:
    global N, NEW, VOCAB
    print("[probe] building the model", flush=True)
    if "--cpu-smoke" in sys.argv:  # the script's logic on a tiny CPU model (tests/repo/test_bench_decode_probe.py)
        from tests.helpers import tiny_model

        model, N, NEW = tiny_model(), 4, 6
        VOCAB = model.cfg.vocab_size
    else:
        model = device_model(seed=1, vocab_size=VOCAB)
    rng = random.Random(0)
    lengths = [1, 5, 64, 130, 300] if "--cpu-smoke" not in sys.argv else [1, 5, 12]
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.choice(lengths))] for _ in range(N)]
    seeds = [rng.randrange(2**63) for _ in range(N)]
    params = SamplingParams(max_new_tokens=NEW, temperature=0.9)
    if "--poison" in sys.argv:
        return poison_main(model, prompts, seeds, params)
    calls, records = {}, []
    for name, n, graphs in (("E1", N, False), ("G8", min(8, N), None), ("E2", N, False), ("E3", N, False),
                            ("G64", N, None)):  # None: graphs where the device has them
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
