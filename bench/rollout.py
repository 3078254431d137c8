"""Rollout speed on one GPU: the native engine (and, given --sglang-python, a live SGLang server on the same weights,
prompts and seeds): generated tokens/s and ms per decode step at batch 1/8/64/256 for the Qwen3-0.6B and 4B shapes
(random bf16 weights, `sglang` kernels, triton attention), 64-token prompts, 128 new tokens, no EOS, with the HBM
roofline of a decode step beside each row.

    PYTHONPATH=. python bench/rollout.py [--models qwen3-0.6b,qwen3-4b] [--batches 1,8,64,256] [--modes graph,eager]
    PYTHONPATH=. python bench/rollout.py --sglang-python /path/to/sglang-venv/bin/python   adds the live-server rows
    python bench/rollout.py --cpu-smoke      a tiny model on CPU (reference kernels): checks the script, not speed

Per row, `generate` is timed end to end (prefill, every sampled token, the read-back; with graphs, the capture each
call makes), median of --runs after one warm-up call: tok/s = batch * new tokens / that time. ms/step = (that time
- the time of a 1-token generate) / (new tokens - 1): the decode steps alone. Roofline: the bytes a decode step must
read at least (every weight once, lm_head included; each row's K and V at the mean length of the decode steps,
prompt + new / 2) / 4.8e12 B/s (H200 HBM3e); ratio = measured / roofline. Modes: graph = the decode step as a CUDA
graph (rollout/native/decode_graph.py), eager = the same step launched op by op ($TOP_RL_DECODE_GRAPHS=0's path).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])

import torch  # noqa: E402

from bench._trainer_common import MODELS  # noqa: E402
from bench._util import table  # noqa: E402
from top_rl.model import Qwen3  # noqa: E402
from top_rl.engine.interface import SamplingParams  # noqa: E402
from top_rl.rollout.native.engine import NativeEngine  # noqa: E402

HBM_BYTES_PER_S = 4.8e12
HEADER = ["model", "engine", "mode", "batch", "gen tok/s", "ms/step", "roofline ms/step", "ratio", "tokens = native"]


def decode_step_bytes(cfg, batch: int, mean_len: float, bytes_per_el: int = 2) -> float:
    """Bytes one decode step reads at least: each weight once (compute dtype; fp32 norms) and every row's K and V."""
    h, d = cfg.hidden_size, cfg.head_dim
    per_layer = (cfg.q_size + 2 * cfg.kv_size) * h + h * cfg.q_size + 3 * cfg.intermediate_size * h
    weights = (cfg.num_hidden_layers * per_layer + cfg.vocab_size * h) * bytes_per_el
    norms = (cfg.num_hidden_layers * (2 * h + 2 * d) + h) * 4
    kv = batch * mean_len * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * d * bytes_per_el
    return weights + norms + kv


def build_model(name: str, device: str) -> Qwen3:
    cfg = MODELS[name]
    if device == "cuda":
        from tests.gpu._common import device_model

        return device_model(seed=0, **{k: getattr(cfg, k) for k in (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "tie_word_embeddings")}).eval()
    return Qwen3(cfg, "bfloat16").init_random(0).eval()


def prompts_and_seeds(batch: int, prompt_len: int, vocab: int):
    rng = random.Random(batch)
    return [[rng.randrange(3, vocab) for _ in range(prompt_len)] for _ in range(batch)], list(range(batch))


def timed(fn, runs: int) -> tuple[float, object]:
    """(median seconds of fn() over `runs` calls after one warm-up, the last result)."""
    out = fn()
    times = []
    for _ in range(runs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def row(name, engine_name, mode, batch, cfg, full_s, one_s, new, prompt_len, same=""):
    step_ms = (full_s - one_s) / (new - 1) * 1e3
    roof_ms = decode_step_bytes(cfg, batch, prompt_len + new / 2) / HBM_BYTES_PER_S * 1e3
    return [name, engine_name, mode, batch, f"{batch * new / full_s:.0f}", f"{step_ms:.2f}", f"{roof_ms:.3f}",
            f"{step_ms / roof_ms:.1f}", same]


def native_rows(model, name, batches, modes, prompt_len, new, runs, budget_at) -> tuple[list, dict]:
    """Rows of the native engine; and its tokens per batch (for the live-server comparison)."""
    rows, tokens = [], {}
    full, one = SamplingParams(new, 1.0), SamplingParams(1, 1.0)
    for mode in modes:
        engine = NativeEngine(model, "decode", eos_token_id=-1, cuda_graphs=mode == "graph")
        for b in batches:
            if time.monotonic() > budget_at:
                print(f"[bench] time budget spent: skipping {name} {mode} batch {b}", flush=True)
                continue
            prompts, seeds = prompts_and_seeds(b, prompt_len, model.cfg.vocab_size)
            full_s, samples = timed(lambda: engine.generate(prompts, seeds, full), runs)
            one_s, _ = timed(lambda: engine.generate(prompts, seeds, one), runs)
            tokens.setdefault(b, [s.response_ids for s in samples])
            rows.append(row(name, "native", mode, b, model.cfg, full_s, one_s, new, prompt_len))
            print("[bench] " + " | ".join(map(str, rows[-1])), flush=True)
    return rows, tokens


def sglang_rows(model, name, batches, prompt_len, new, runs, python, native_tokens) -> list:
    """A live SGLang server (launched by top_rl.rollout.sglang.engine.SglangEngine with the TOP contract's flags, triton
    attention) on this model written as an HF checkpoint: the same prompts, seeds and timing of the generation request
    alone (the engine's prefill re-scoring, which the gate reads, is not timed: the native rows do not score either);
    `tokens = native` counts the rows whose tokens equal the native engine's."""
    from top_rl.model import save_model
    from top_rl import kernels
    from top_rl.rollout.sglang.engine import SglangEngine, SglangEngineConfig
    from top_rl.rollout.sglang.protocol import generate_payload, items, parse_generation
    from top_rl.rollout.sglang.config import free_port

    def generate(engine, prompts, seeds, params):
        payload = generate_payload(prompts, seeds, engine.sampling(params))
        return [parse_generation(item, i) for i, item in enumerate(items(engine.client.generate(payload), len(prompts)))]

    rows = []
    with tempfile.TemporaryDirectory() as ckpt:
        save_model(model, ckpt)
        cfg = SglangEngineConfig(model_path=ckpt, attention_backend="triton", logprob_source="prefill", top=True,
                                 python=python, weights_dir=ckpt,
                                 port=free_port(), mem_fraction_static=0.5, log_path=os.path.join(ckpt, "server.log"),
                                 extra_sampling={"ignore_eos": True})  # no EOS, as the native rows
        engine = SglangEngine(cfg, "triton", kernels.current_plan().top)  # the contract the native rows ran under
        t0 = time.monotonic()
        engine.start()
        print(f"[bench] {name}: SGLang server up in {time.monotonic() - t0:.0f} s", flush=True)
        try:
            full, one = SamplingParams(new, 1.0), SamplingParams(1, 1.0)
            for b in batches:
                prompts, seeds = prompts_and_seeds(b, prompt_len, model.cfg.vocab_size)
                full_s, gens = timed(lambda: generate(engine, prompts, seeds, full), runs)
                one_s, _ = timed(lambda: generate(engine, prompts, seeds, one), runs)
                want = native_tokens.get(b)
                same = "" if want is None else f"{sum(g.output_ids == w for g, w in zip(gens, want))}/{b}"
                rows.append(row(name, "sglang", "server", b, model.cfg, full_s, one_s, new, prompt_len, same))
                print("[bench] " + " | ".join(map(str, rows[-1])), flush=True)
        finally:
            engine.shutdown()
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="qwen3-0.6b,qwen3-4b")
    p.add_argument("--batches", default="1,8,64,256")
    p.add_argument("--modes", default="graph,eager")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=480, help="stop starting rows past this many seconds")
    p.add_argument("--sglang-python", default=None, help="a Python with the pinned sglang: adds live-server rows")
    p.add_argument("--sglang-models", default="qwen3-0.6b", help="the models that get live-server rows")
    p.add_argument("--out", default=os.environ.get("OUT"), help="also write the table to OUT/rollout.md")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny model on CPU: checks the script, not speed")
    args = p.parse_args(argv)
    device = "cpu" if args.cpu_smoke else "cuda"
    if args.cpu_smoke:
        args.models, args.batches, args.modes, args.prompt_len, args.new_tokens, args.runs = \
            "tiny", "1,8", "eager", 8, 6, 1
    elif not torch.cuda.is_available():
        sys.exit("bench/rollout.py needs a CUDA GPU (or --cpu-smoke)")
    from top_rl import kernels

    from top_rl.kernels import plan

    kernels.install(plan.build("sglang" if device == "cuda" else "reference",
                               attention=os.environ.get(plan.ATTENTION_ENV, "triton") if device == "cuda" else None))
    budget_at = time.monotonic() + args.budget_s
    rows = []
    for name in args.models.split(","):
        model = build_model(name, device)
        with torch.no_grad():
            got, tokens = native_rows(model, name, [int(b) for b in args.batches.split(",")], args.modes.split(","),
                                      args.prompt_len, args.new_tokens, args.runs, budget_at)
            rows += got
            if args.sglang_python and name in args.sglang_models.split(","):
                rows += sglang_rows(model, name, [int(b) for b in args.batches.split(",")], args.prompt_len,
                                    args.new_tokens, args.runs, args.sglang_python, tokens)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    title = (f"rollout: {args.prompt_len}-token prompts, {args.new_tokens} new tokens, no EOS, "
             f"{'tiny model on CPU (smoke)' if args.cpu_smoke else torch.cuda.get_device_name()}")
    out = table(title, HEADER, rows)
    print("\n" + out)
    if args.out:
        with open(os.path.join(args.out, "rollout.md"), "w") as f:
            f.write(out)


if __name__ == "__main__":
    main()
