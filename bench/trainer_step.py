"""(d) The TOP trainer against the fastest stock trainer on this machine: one run prints the whole table.

TOP    top_rl.train.Trainer (Megatron-core + the TOP layer spec) on the `sglang` kernels, attention from
       $TOP_RL_ATTENTION_BACKEND (default triton): train_step, plus its gate forward (`logprobs`).
stock  Megatron-core's own GPTModel, local spec, bf16, cuBLAS, the fastest correct torch varlen attention, Liger's
       Triton RMSNorm, Megatron's fused SwiGLU, compiled RoPE and chunked fused log-softmax (bench/_stock_gpt.py).
Same model shape, same ~16k-token batch of mixed-length sequences, same scored rows and loss, same optimizer
(Megatron DDP + torch's fused AdamW on fp32 master weights, sync-free grad norm: GpuAdamW), recompute on and off:
step time (median and min-max of --iters steps), tokens/s, MFU (model FLOPs) and HFU (with recompute's second
forward) on the H200's dense bf16 peak of 989.4 TFLOP/s, peak memory; and a torch.profiler table of GPU time per op
family.
"TOP before" (first model, recompute on) is the TOP trainer with the issue-12 speedups switched off (eager
elementwise forwards and backwards, memory-efficient attention backward): the before/after of this code in one run.

Each (model, trainer, recompute) runs in its own process (bench/_trainer_worker.py) with a timeout; tables are printed as
workers finish and in full at the end (also written to $OUT/trainer_step.md when $OUT is set).
  python bench/trainer_step.py                 Qwen3-0.6B and Qwen3-4B; stops starting workers after 420 s, so
                                               recompute-off rows of the second model may be skipped
  TOP_RL_BENCH_MODELS=qwen3-0.6b python bench/trainer_step.py    one model, all rows (~5 minutes cold)
  python bench/trainer_step.py --cpu-smoke     the whole harness on a tiny model on CPU (no GPU needed)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _trainer_report as report  # noqa: E402

# micro-batch token budget with recompute off: the 4B model's activations at 16k tokens do not fit one H200
MBT_OFF = {"qwen3-0.6b": 16384, "qwen3-4b": 4096, "tiny": 256}
TIMEOUT_S = {"qwen3-0.6b": 240, "qwen3-4b": 240, "tiny": 300}  # per worker; the first one JIT-compiles everything


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", default=os.environ.get("TOP_RL_BENCH_QUICK") == "1")
    p.add_argument("--models", default=os.environ.get("TOP_RL_BENCH_MODELS"),
                   help="comma list (default: qwen3-0.6b,qwen3-4b; --quick: qwen3-0.6b); env TOP_RL_BENCH_MODELS")
    p.add_argument("--impls", default="top,stock")
    p.add_argument("--recompute", default=os.environ.get("TOP_RL_BENCH_RECOMPUTE", "on,off"),
                   help="on,off | on | off (env TOP_RL_BENCH_RECOMPUTE); the first one's rows run first")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--profile", default="on", help="profile the step with recompute on | off | none")
    p.add_argument("--no-before", dest="before", action="store_false",
                   help="skip the 'TOP before' row (fused forwards/backwards off, memory-efficient attention backward)")
    p.add_argument("--flash-recompute", action="store_true",
                   help="add the 'TOP flash recompute' rows (recompute on, every model): top.fast_paths."
                        "recompute_attention, the recompute's attention forward as FlashAttention-2")
    p.add_argument("--gemm-recompute", action="store_true",
                   help="add the 'TOP cuBLAS recompute' rows (recompute on, every model): top.fast_paths."
                        "recompute_gemm, the recompute's GEMMs on cuBLAS")
    p.add_argument("--budget-s", type=float, default=float(os.environ.get("TOP_RL_BENCH_BUDGET_S", 420)),
                   help="stop starting workers past this many seconds (the device call allows 600)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (the first compiles)")
    p.add_argument("--iters", type=int, default=5, help="timed steps per worker: the median and min-max are reported")
    p.add_argument("--out", default=os.environ.get("OUT"))
    p.add_argument("--cpu-smoke", action="store_true", help="tiny model on CPU: checks the harness, not speed")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.models, args.tokens, args.device = "tiny", 512, "cpu"
        args.warmup, args.iters = 1, 1
    else:
        args.device = "cuda"
    if args.models is None:
        args.models = "qwen3-0.6b" if args.quick else "qwen3-0.6b,qwen3-4b"
    return args


class Worker:
    """One subprocess; its RESULT/PROFILE/ATTN/NOTE lines are parsed as they arrive, stderr goes to the log."""

    def __init__(self, argv, log, timeout_s, on_record):
        self.argv, self.log, self.timeout_s, self.on_record = argv, log, timeout_s, on_record
        self.timed_out = False
        self.last_error = ""  # the last exception line the worker wrote to stderr

    def _scan_errors(self, start: int) -> None:
        with open(self.log.name, errors="replace") as f:
            f.seek(start)
            lines = [ln.strip() for ln in f if re.match(r"^[\w.]*(Error|Exception|error)\b", ln.strip())]
        self.last_error = lines[-1][:200] if lines else ""

    def run(self) -> int:
        cmd = [sys.executable, "-u", str(ROOT / "bench" / "_trainer_worker.py"), *self.argv]
        self.log.write(f"\n===== {' '.join(cmd)}\n")
        self.log.flush()
        start = self.log.tell()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=ROOT,
                                start_new_session=True)

        def kill():
            self.timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(self.timeout_s, kill)
        timer.start()
        try:
            for line in proc.stdout:
                kind, _, rest = line.partition(" ")
                if kind in ("RESULT", "PROFILE", "ATTN", "NOTE"):
                    try:
                        self.on_record(kind, json.loads(rest))
                        continue
                    except json.JSONDecodeError:
                        pass
                self.log.write(line)
            return proc.wait()
        finally:
            timer.cancel()
            self.log.flush()
            self._scan_errors(start)


def main(argv=None) -> int:
    args = parse(argv)
    t0 = time.time()
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    log_path = (out / "trainer_step_workers.log") if out else Path("/tmp/top_rl_trainer_step_workers.log")
    rep = report.Report(args)
    print(rep.header(), flush=True)
    models, impls = args.models.split(","), args.impls.split(",")
    profile_models = models if not args.quick else models[:1]

    with open(log_path, "w") as log:
        def on_record(kind, rec):
            rep.add(kind, rec)

        def budget_left():
            return args.budget_s - (time.time() - t0)

        attention = {m: "math" for m in models} if args.cpu_smoke else {}
        if "stock" in impls and not args.cpu_smoke:
            w = Worker(["--select-attention", "--model", ",".join(models), "--tokens", str(args.tokens),
                        "--device", args.device], log, min(120, max(10, budget_left())), on_record)
            rc = w.run()
            attention = {m: rep.chosen_attention(m) for m in models}
            print(rep.attention_table(rc, w.timed_out, w.last_error), flush=True)
        # One process per (model, trainer, recompute): each starts with an empty GPU. Recompute on first for
        # every model, so a spent budget drops the recompute-off rows of the largest model first.
        rcs = args.recompute.split(",")
        # the recompute fast paths' rows (recompute on only): top.fast_paths.recompute_attention, recompute_gemm
        fast_rc = [impl for impl, wanted in (("top_flash_rc", args.flash_recompute),
                                             ("top_cublas_rc", args.gemm_recompute)) if wanted and "top" in impls]

        def rows_of(rc, model):  # a model's rows at one recompute setting, the recompute fast paths' last
            return [(rc, model, i) for i in impls] + ([(rc, model, i) for i in fast_rc] if rc == "on" else [])

        jobs = [job for m in models for job in rows_of(rcs[0], m)]
        if args.before and "top" in impls:  # the trainer without this branch's speedups, first model
            jobs.append((rcs[0], models[0], "top_base"))
        jobs += [job for rc in rcs[1:] for m in models for job in rows_of(rc, m)]
        for rc, model, impl in jobs:
            left = budget_left()
            key = (model, impl, rc)
            if left < 30:
                rep.skip(key, f"skipped: {args.budget_s:.0f} s budget spent")
            elif impl == "stock" and attention.get(model) is None:
                rep.skip(key, "skipped: no correct stock attention kernel (see the attention table)")
            else:
                wargv = ["--impl", impl, "--model", model, "--tokens", str(args.tokens), "--recompute", rc,
                         "--mbt-on", str(args.tokens), "--mbt-off", str(min(args.tokens, MBT_OFF[model])),
                         "--warmup", str(args.warmup), "--iters", str(args.iters), "--device", args.device,
                         "--profile", args.profile if model in profile_models else "none"]
                if impl == "stock":
                    wargv += ["--attention", attention[model]]
                if impl in ("top_base", *fast_rc):  # their time, not their profile: the table compares TOP's
                    wargv[wargv.index("--profile") + 1] = "none"
                w = Worker(wargv, log, min(TIMEOUT_S[model], left), on_record)
                t1 = time.time()
                code = w.run()
                rep.finish(key, code, w.timed_out, time.time() - t1, w.last_error)
            print(rep.progress(*key), flush=True)

    final = rep.final(time.time() - t0, log_path)
    print(final, flush=True)
    if out:
        (out / "trainer_step.md").write_text(rep.final(time.time() - t0, log_path, full=True))
        (out / "trainer_step.jsonl").write_text("\n".join(json.dumps(r) for r in rep.records) + "\n")
    return 0 if rep.all_ok() else 1


if __name__ == "__main__":
    sys.exit(main())
