"""Issue 30 item 12's probe (GPU): does the native engine's eager decode repeat bitwise, and what changed when it
does not?

    python bench/decode_repeat_probe.py            (on the H200: PYTHONPATH as scripts/gpu_run.sh sets it) runs the
                                                    calls of tests/gpu/test_native_decode.py in their order in one
                                                    process, each generate call's prefill hooked layer by layer, and
                                                    after each call prints its time, how its prefill and samples
                                                    differ from the first and the settled eager call, the Triton
                                                    kernel variants compiled during it and torch.compile's recompiles
    python bench/decode_repeat_probe.py --profile [--eager]   (where one generate call's time goes: its phases
                                                    and cProfile's top functions, after a warm-up call)
    python bench/decode_repeat_probe.py --poison   (the same prefill and eager generate after filling the allocator's
                                                    free memory with 0, NaN or 1e4: outputs that change with it read
                                                    memory nobody wrote; then the first layer whose prefill output
                                                    changes)

Session 10 saw the module's eager fixture (the first eager call after a graph capture) differ from every later call,
all of which agree. Sessions 11 and 12 ran this probe without the `sglang` kernels (the reference backend, the process
default): their rows say nothing about the engine's kernels; the probe now installs them as tests/gpu/conftest.py does.
Session 13 (the `sglang` kernels, the test module's order): every call equal to every other, and poisoned free memory
changed nothing. The test module's difference was its own: its module-scoped `eager` fixture ran before the per-test
kernel plan, on the reference kernels (tests/gpu/conftest.py now installs the plan for the session).
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
from top_rl.engine.interface import SamplingParams  # noqa: E402
from top_rl.rollout.native.engine import NativeEngine  # noqa: E402

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


def _isinstance_alive(obj, cls) -> bool:
    """isinstance, for every object the GC holds: a weakref proxy whose referent died raises on it."""
    try:
        return isinstance(obj, cls)
    except ReferenceError:
        return False


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
        objs = [o for o in gc.get_objects() if _isinstance_alive(o, JITFunction)]
    for obj in objs:
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


DEFAULT_PLAN = "E64,P,P,G8,P,E64,E64,A0,A17,Alast,G64"  # tests/gpu/test_native_decode.py's calls, in its order


def parse_plan(text: str, n: int) -> list[tuple[str, str, int | None]]:
    """--plan entries: E<n> an eager generate of the first n prompts, G<n> the same with CUDA graphs where audited,
    A<i> / Alast prompt i alone (eager), P a bare prefill of all prompts. Returns (name, kind, n or i); repeated
    entries are named E64a, E64b, ..."""
    out, seen = [], {}
    for tok in text.split(","):
        kind, arg = tok[0], tok[1:]
        if kind not in "EGAP" or (kind != "P" and not (arg.isdigit() or (kind == "A" and arg == "last"))):
            raise SystemExit(f"decode_repeat_probe: bad --plan entry {tok!r} (E<n>, G<n>, A<i>, Alast, P)")
        val = None if kind == "P" else (n - 1 if arg == "last" else min(int(arg), n if kind != "A" else n - 1))
        seen[tok] = seen.get(tok, 0) + 1
        out.append((tok, kind, val))
    counts = {t: 0 for t in seen}
    named = []
    for tok, kind, val in out:
        counts[tok] += 1
        named.append((tok + ("abcdefghij"[counts[tok] - 1] if seen[tok] > 1 else ""), kind, val))
    return named


def trace_main(model, prompts, seeds, params, plan_text: str = DEFAULT_PLAN) -> None:
    """The calls of `plan_text` (default: tests/gpu/test_native_decode.py's, in its order) in one process. Each
    generate call's prefill is hooked layer by layer (hooks only around the prefill: a graph capture cannot hold their
    host copies). After each call: its time, its prefill and samples against the first generate call, the Triton
    variants compiled during it, torch.compile's recompiles; at the end every pair of generate calls (on the prompts
    they share) and where each differing pair first differs."""
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

    def shared(a, b):
        (ia, ra), (ib, rb) = got[a], got[b]
        return [(ra[ia.index(i)], r) for i, r in zip(ib, rb) if i in ia], [i for i in ib if i in ia]

    def vs(a, b) -> str:
        pairs, _ = shared(a, b)
        return "%d / %d" % _diff([x for x, _ in pairs], [y for _, y in pairs]) if pairs else "-"

    plan = parse_plan(plan_text, len(prompts))
    got, layers, full, ref = {}, {}, {}, None
    print(f"\n### calls {plan_text} in one process (diffs: token rows / sampler log-prob positions)\n\n"
          "| call | s | prefill vs first | vs first | Triton variants compiled | torch.compile recompiles |\n"
          "|---|---|---|---|---|---|", flush=True)
    before, comp = triton_specializations(), _counters()
    for name, kind, val in plan:
        t0 = time.perf_counter()
        if kind == "P":
            layers[name] = full[name] = bare_prefill()
        else:
            idx = list(range(val)) if kind in "EG" else [val]
            eng = engine(False if kind in "EA" else None)
            rows = eng.generate([prompts[i] for i in idx], [seeds[i] for i in idx], params)
            got[name], layers[name] = (idx, rows), eng.layers
            if len(idx) == len(prompts):
                full[name] = eng.layers
            ref = ref or name
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        secs = time.perf_counter() - t0
        after, comp_after = triton_specializations(), _counters()
        new = _new_variants(before, after)
        recompiles = {k: v for k, v in comp_after.get("recompiles", {}).items()
                      if comp.get("recompiles", {}).get(k) != v}
        first_full = next(iter(full), None)
        pre = _first_layer_diff(full[name], full[first_full]) if name in full and first_full != name else "-"
        print(f"| {name} | {secs:.1f} | {pre} | {vs(ref, name) if name in got and ref != name else '-'} | "
              f"{ {k.rsplit('.', 1)[-1]: len(v) for k, v in new.items()} or '-'} | {recompiles or '-'} |", flush=True)
        for k, v in new.items():
            print(f"[probe] {name}: new variants of {k}: {v}", flush=True)
        before, comp = after, comp_after
    names = list(got)
    print("\n### every pair of generate calls\n\n| call | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    for a in names:
        print(f"| {a} | " + " | ".join(vs(a, b) if a != b else "." for b in names) + " |")
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pairs, idx = shared(a, b)
            for k, (x, y) in zip(idx, pairs):
                u, v = torch.tensor(x.sample_logprobs), torch.tensor(y.sample_logprobs)
                if u.shape == v.shape and not torch.equal(u, v):
                    pos = (u != v).nonzero().flatten().tolist()
                    print(f"[probe] {a} vs {b}: first differing sample {k} (prompt length {len(prompts[k])}), "
                          f"positions {pos[:10]}, {a} {u[pos[:10]].tolist()}, {b} {v[pos[:10]].tolist()}", flush=True)
                    break
    print(f"\n[probe] fallbacks: {kernels.report()['fallbacks']}; compile counters: {json.dumps(_counters())}",
          flush=True)


def profile_main(model, prompts, seeds, params) -> None:
    """Where a generate call's time goes: one warm-up call, then the same call with its phases timed (the device
    synchronized around each) and under cProfile; prints the phases and the 25 functions of most cumulative time."""
    import cProfile
    import io
    import pstats
    import time

    from top_rl.rollout.native import decode_graph, engine as native

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    spent: dict[str, list[float]] = {}

    def timed(owner, attr, label):
        real = getattr(owner, attr)

        def wrapper(*a, **k):
            sync()
            t0 = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                sync()
                spent.setdefault(label, []).append(time.perf_counter() - t0)
        setattr(owner, attr, wrapper)

    graphs = "--eager" not in sys.argv and None
    eng = NativeEngine(model, "decode", eos_token_id=-1, cuda_graphs=False if graphs is False else None)
    t0 = time.perf_counter()
    eng.generate(prompts, seeds, params)
    print(f"[probe] warm-up generate ({'eager' if graphs is False else 'graphs where audited'}): "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    for owner, attr, label in ((NativeEngine, "_prefill", "prefill"), (native.DecodeState, "step", "eager step"),
                               (decode_graph.StepRunner, "_capture", "capture"),
                               (decode_graph.StepRunner, "step", "runner step (eager, capture or replay)"),
                               (native, "sample", "sample"), (NativeEngine, "_samples", "samples to host")):
        timed(owner, attr, label)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    eng.generate(prompts, seeds, params)
    prof.disable()
    total = time.perf_counter() - t0
    print(f"\n### one generate call ({len(prompts)} prompts, {params.max_new_tokens} new tokens): {total:.2f} s\n\n"
          "| phase | calls | total s | max s |\n|---|---|---|---|")
    for label, ts in spent.items():
        print(f"| {label} | {len(ts)} | {sum(ts):.3f} | {max(ts):.3f} |")
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
    print(buf.getvalue(), flush=True)


def main() -> None:
    global N, NEW, VOCAB
    print("[probe] building the model", flush=True)
    if "--cpu-smoke" in sys.argv:  # the script's logic on a tiny CPU model (tests/repo/test_bench_decode_probe.py)
        from tests.helpers import tiny_model

        model, N, NEW = tiny_model(), 4, 6
        VOCAB = model.cfg.vocab_size
    else:  # the tests' kernels (tests/gpu/conftest.py): the process default is the reference backend
        import os

        from top_rl.kernels import plan as kernel_plan

        # installed for the process (a use_plan() context dropped after __enter__ is closed by the GC, and its
        # finally restores the reference backend: session 12's first run measured that backend)
        kernels.install(kernel_plan.build("sglang", attention=os.environ.get(kernel_plan.ATTENTION_ENV, "triton")))
        if kernels.current_plan().backend != "sglang":
            raise SystemExit(f"decode_repeat_probe: the sglang kernels are not installed ({kernels.current_plan()})")
        print(f"[probe] kernels: {kernels.current_plan()}", flush=True)
        model = device_model(seed=1, vocab_size=VOCAB)
    rng = random.Random(0)
    lengths = [1, 5, 64, 130, 300] if "--cpu-smoke" not in sys.argv else [1, 5, 12]
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.choice(lengths))] for _ in range(N)]
    seeds = [rng.randrange(2**63) for _ in range(N)]
    if "--new" in sys.argv:  # fewer new tokens: a quicker call (the test module's shape is 40)
        NEW = int(sys.argv[sys.argv.index("--new") + 1])
    params = SamplingParams(max_new_tokens=NEW, temperature=0.9)
    if "--poison" in sys.argv:
        return poison_main(model, prompts, seeds, params)
    if "--profile" in sys.argv:
        return profile_main(model, prompts, seeds, params)
    plan = sys.argv[sys.argv.index("--plan") + 1] if "--plan" in sys.argv else DEFAULT_PLAN
    return trace_main(model, prompts, seeds, params, plan)


if __name__ == "__main__":
    main()
