"""Issue 30 item 12's probe (GPU): does the native engine's eager decode repeat bitwise, and what changed when it
does not?

    python bench/decode_repeat_probe.py            (on the H200: PYTHONPATH as scripts/gpu_run.sh sets it) runs the
                                                    calls of tests/gpu/test_native_decode.py in their order in one
                                                    process, each generate call's prefill hooked layer by layer, and
                                                    after each call prints its time, how its prefill and samples
                                                    differ from the first and the settled eager call, the Triton
                                                    kernel variants compiled during it and torch.compile's recompiles
    python bench/decode_repeat_probe.py --poison   (the same prefill and eager generate after filling the allocator's
                                                    free memory with 0, NaN or 1e4: outputs that change with it read
                                                    memory nobody wrote; then the first layer whose prefill output
                                                    changes)

Session 10 saw the module's eager fixture (the first eager call after a graph capture) differ from every later call,
all of which agree; session 11's poisoned runs showed eager decode reads no unwritten memory.
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


def triton_specializations() -> dict[str, list[str]]:
    """Every Triton JIT kernel in the process and the cache keys of the variants compiled so far (a key holds the
    specialization: argument dtypes, 16-divisibility of pointers and integers, constexpr values)."""
    import gc
    import warnings

    try:
        from triton.runtime.jit import JITFunction
    except ImportError:  # no Triton (CPU): nothing compiled
        return {}
    out: dict[str, list[str]] = {}
    with warnings.catch_warnings():  # isinstance on every object touches deprecated module attributes
        warnings.simplefilter("ignore")
        objs = [o for o in gc.get_objects() if isinstance(o, JITFunction)]
    for obj in objs:
        if True:
            keys = []
            for entry in getattr(obj, "device_caches", {}).values():
                cache = entry[0] if isinstance(entry, tuple) else entry
                keys += [str(k) for k in cache]
            if keys:
                name = f"{obj.fn.__module__}.{obj.fn.__name__}"
                out[name] = out.get(name, []) + keys
    return out


def _new_variants(before: dict, after: dict) -> dict[str, list[str]]:
    return {k: [v[:400] for v in after[k] if v not in before.get(k, [])] for k in after
            if len(after[k]) > len(before.get(k, []))}


def _first_layer_diff(a, b) -> str:
    for (name, x), (_, y) in zip(a, b):
        if not torch.equal(x, y):
            return f"{name} ({int((x != y).sum())} values, max {(x - y).abs().max().item():.3g})"
    return "none"


def trace_main(model, prompts, seeds, params) -> None:
    """The order of tests/gpu/test_native_decode.py in one process: E64a (the sync test's eager call), two bare
    prefills, G8 (the prefill test's graph call), a prefill, E64b (the module's eager fixture), E64c, each of samples
    0, 17, last alone (eager), G64. Each generate call's prefill is hooked layer by layer (hooks only around the
    prefill: a graph capture cannot hold their host copies). After each call: its time, its prefill and samples
    against E64a and (once there) E64c, the Triton variants compiled during it, torch.compile's counters."""
    import time

    def engine(graphs):
        eng = NativeEngine(model, "decode", eos_token_id=-1, cuda_graphs=graphs)
        real = eng._prefill
        eng.layers = None

        def hooked(*a):
            out = []
            eng.layers = layer_outputs(model, lambda: out.append(real(*a)) or out[0])
            return out[0]
        eng._prefill = hooked
        return eng

    def bare_prefill():
        eng = NativeEngine(model, "decode", eos_token_id=-1, cuda_graphs=False)
        with torch.no_grad():
            cache = model.new_kv_cache(len(prompts), max(map(len, prompts)) + NEW)
            return layer_outputs(model, lambda: eng._prefill(prompts, cache, model.lm_head_weight()))

    last = len(prompts) - 1
    plan = [("E64a", N, False), ("P1", None, None), ("P2", None, None), ("G8", min(8, N), None), ("P3", None, None),
            ("E64b", N, False), ("E64c", N, False), ("A0", 0, False), ("A17", min(17, last), False),
            ("Alast", last, False), ("G64", N, None)]
    got, layers = {}, {}
    print("\n### the test module's order in one process (diffs: token rows / sampler log-prob positions)\n\n"
          "| call | s | prefill vs E64a | prefill vs E64c | vs E64a | vs E64c | Triton variants compiled | "
          "torch.compile recompiles |\n|---|---|---|---|---|---|---|---|", flush=True)
    before, comp = triton_specializations(), _counters()
    for name, n, graphs in plan:
        t0 = time.perf_counter()
        if n is None:
            layers[name], rows = bare_prefill(), None
        else:
            idx = list(range(n)) if name[0] in "EG" else [n]
            eng = engine(graphs)
            rows = eng.generate([prompts[i] for i in idx], [seeds[i] for i in idx], params)
            got[name], layers[name] = (idx, rows), eng.layers
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        secs = time.perf_counter() - t0
        after, comp_after = triton_specializations(), _counters()
        new = _new_variants(before, after)
        recompiles = {k: v for k, v in comp_after.get("recompiles", {}).items()
                      if comp.get("recompiles", {}).get(k) != v}

        def vs(ref):
            if ref not in got or rows is None:
                return "-"
            ridx, rrows = got[ref]
            pairs = [(rrows[ridx.index(i)], r) for i, r in zip(got[name][0], rows) if i in ridx]
            return "%d / %d" % _diff([a for a, _ in pairs], [b for _, b in pairs])

        def prefill_vs(ref):
            if ref not in layers or layers[ref] is None or name.startswith(("A", "G8")) or ref == name:
                return "-"
            return _first_layer_diff(layers[name], layers[ref])

        print(f"| {name} | {secs:.1f} | {prefill_vs('E64a')} | {prefill_vs('E64c')} | {vs('E64a')} | {vs('E64c')} | "
              f"{ {k.rsplit('.', 1)[-1]: len(v) for k, v in new.items()} or '-'} | {recompiles or '-'} |", flush=True)
        for k, v in new.items():
            print(f"[probe] {name}: new variants of {k}: {v}", flush=True)
        before, comp = after, comp_after
    for a, b in (("E64a", "E64c"), ("E64b", "E64c"), ("E64a", "E64b")):
        _, ra = got[a]
        _, rb = got[b]
        for i, (x, y) in enumerate(zip(ra, rb)):
            u, v = torch.tensor(x.sample_logprobs), torch.tensor(y.sample_logprobs)
            if u.shape == v.shape and not torch.equal(u, v):
                pos = (u != v).nonzero().flatten().tolist()
                print(f"[probe] {a} vs {b}: first differing sample {i} (prompt length {len(prompts[i])}), positions "
                      f"{pos[:10]}, {a} {u[pos[:10]].tolist()}, {b} {v[pos[:10]].tolist()}", flush=True)
                break
    print(f"\n[probe] fallbacks: {kernels.report()['fallbacks']}; compile counters: {json.dumps(_counters())}",
          flush=True)


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
    return trace_main(model, prompts, seeds, params)


if __name__ == "__main__":
    main()
