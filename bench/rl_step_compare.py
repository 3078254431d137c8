"""The whole RL step, TOP against what users run without it, side by side: the same job (GSM8K, a random Qwen3-0.6B
shape, one GPU shared by a live SGLang server and the trainer), the same prompts and seeds, every part of the step.

Two top-rl jobs run (TOP and NON_TOP, one typed Job each); the table's columns (sides(), one typed Side each) use them
(both: bench/_compare_sides.py; the table and the lines under it: bench/_compare_report.py):
  TOP                  the shipped default: the contract's rl mode on the server, `top.attention_backend=auto`
                       (fa3 with the decode log-probs on Hopper under 0.5.11's contract) and the trainer on the
                       engine's kernels; PPO's old policy = the rollout's log-probs, proven equal by the gate
  non-TOP              SGLang's default mode (`top.enabled=false`: no determinism flag, radix cache and CUDA graphs on,
                       attention fa3, SGLang's Hopper default, named so that the bundle's FA3 runs, with its piecewise
                       prefill CUDA graphs off: 0.5.11's default mode crashes capturing them on fa3, _compare_sides.py;
                       --non-top-attention picks another) and our Qwen3 trainer on the `stock` kernels
                       (top_rl/kernels/stock.py: varlen flash attention, Liger's RMSNorm, cuBLAS GEMMs), with the
                       separate old-log-prob forward verl and slime run by default (`algo.old_logprobs=recompute`)
The non-TOP columns: that job with and without its old-log-prob forward (without: its step less the forward's
seconds), and the same with the trainer swapped for the strong stock trainer of bench/trainer_step.py (Megatron-core's
own GPTModel, bench/_stock_gpt.py), timed by bench/_trainer_worker.py in its own process right after the non-TOP job,
on that job's batch shape (its samples, mean prompt and response lengths; the jobs' micro-batch budget and recompute):
its train and old-log-prob forward seconds replace the job's, the rest of its step (the GPU handoff, the trainer's
offload and onload, the driver) is the job's.

Each job runs `--steps` steps; the first (server warm-up, first-use compilation) is left out and the rest give
medians. Prints one table (each part's median seconds per column, then TOP / column per part and for the step) and
under it the card, the releases, the server command each job's config gave (composed by top_rl.cli as the job composes
it), generated tok/s, parity, memory and the kernels each job's trainer ran.

Files go to --out (metrics_<job>.jsonl, server_<job>.json, kernels_<job>.json, megatron_gpt.json, rl_step_compare.md);
a later call with the same --out adds what it runs (`--only`) and prints the table from all of it, so the jobs may run
in separate calls on one warm machine; `--report` runs nothing and prints the table from --out.

    python bench/rl_step_compare.py --out DIR [--steps 4] [--max-new-tokens 1024] [--job-timeout 280] [--only JOB]
                                    [--report] [-- overrides]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._compare_report import partial_table, table  # noqa: E402
from bench._compare_sides import JOB, NON_TOP, TOP, Job, sides  # noqa: E402


# ------------------------------------------------------------------------------------------------ the jobs
def server_plan(job: Job, overrides: list[str]) -> dict:
    """The server command and env the job's config gives (top_rl.cli composes and resolves it as the run does, `auto`
    from this machine's GPU), or why the config was refused."""
    from top_rl import cli

    try:
        cfg = cli.compose([*JOB, *job.overrides(), *overrides])
        plan = cli.launch_plan(cfg)
    except Exception as e:  # noqa: BLE001 - the job itself then fails and says so; the report shows this line
        return {"error": f"{type(e).__name__}: {e}"}
    engine = plan["engines"][0]
    return {"argv": engine["argv"][3:], "env": engine["env"], "attention": plan["attention"],
            "contract": plan["runs"]["contract"], "sglang_release": plan["runs"]["sglang_release"]}


def run_job(job: Job, args, out: Path) -> list[dict]:
    """One job to its end or its --job-timeout (then stopped: SIGTERM, SIGKILL after a grace); its rows are kept
    either way, and its server's last log lines go into its log in --out (a server that died says why there)."""
    for stale in (f"metrics_{job.slug}.jsonl", f"kernels_{job.slug}.json", f"server_{job.slug}.json"):
        (out / stale).unlink(missing_ok=True)
    run_dir = Path(args.run_root) / job.slug
    server_log = run_dir.parent / f"{job.slug}.sglang.log"  # beside run_dir: a fresh run_dir must not exist yet
    server_log.unlink(missing_ok=True)
    shape = [f"run_dir={run_dir}", f"steps={args.steps}", f"rollout.max_new_tokens={args.max_new_tokens}",
             f"rollout.sglang.log_path={server_log}"]
    (out / f"server_{job.slug}.json").write_text(json.dumps(server_plan(job, [*shape, *args.overrides]), indent=1))
    cmd = [*args.launcher, *shape, *JOB, *job.overrides(), *args.overrides]
    log = out / f"compare_{job.slug}.log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.job_timeout or None)
        except subprocess.TimeoutExpired:
            rc = stop(proc)
            print(f"[compare] {job.name}: stopped at --job-timeout {args.job_timeout:g} s (exit {rc})", flush=True)
    if server_log.exists():
        tail = server_log.read_text(errors="replace").splitlines()[-60:]
        with open(log, "a") as f:
            f.write(f"\n[compare] the server's last {len(tail)} log lines ({server_log}):\n" + "\n".join(tail) + "\n")
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    print(f"[compare] {job.name}: exit {rc} after {time.perf_counter() - t0:.0f} s, {len(rows)} steps "
          f"({' '.join(job.overrides())})", flush=True)
    if rows:
        (out / f"metrics_{job.slug}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if (run_dir / "kernels.json").exists():
        (out / f"kernels_{job.slug}.json").write_text((run_dir / "kernels.json").read_text())
    return rows


def stop(proc: subprocess.Popen, grace_s: float = 45.0) -> int:
    """SIGTERM to the job's process group (top-rl stops after the step in flight and shuts its cluster down), then
    SIGKILL to what is left: the next job needs the GPU."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 15.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    return proc.returncode if proc.returncode is not None else -9


# ------------------------------------------------------------------------------- the Megatron GPTModel trainer
def batch_shape(rows: list[dict], skip: int) -> tuple[int, int, int]:
    """(samples, mean prompt tokens, mean response tokens) of the job's timed steps, from its metrics: the samples are
    the generated tokens over the mean response length, the prompts the trained tokens less the generated ones."""
    timed = rows[skip:] or rows
    med = lambda f: statistics.median(f(r) for r in timed)  # noqa: E731
    response = med(lambda r: r["rollout/response_len_mean"])
    generated = lambda r: r["perf/rollout_tokens_per_s"] * r["perf/rollout_time"]  # noqa: E731
    samples = round(med(lambda r: generated(r) / r["rollout/response_len_mean"]))
    prompt = round(med(lambda r: r["train/tokens"]) / samples - response)
    return samples, max(1, prompt), max(1, round(response))


def job_trainer(overrides: list[str]) -> dict:
    """The jobs' micro-batch budget and recompute (their config: the experiment's trainer), for the worker."""
    from top_rl import cli

    t = cli.compose([*JOB, *overrides], check=False).trainer
    return {"micro_batch_tokens": t.micro_batch_tokens, "recompute": "on" if t.recompute else "off"}


def run_megatron_gpt(rows: list[dict], args, out: Path) -> dict:
    """bench/_trainer_worker.py --impl stock on the job's batch shape: its step (forward, backward, optimizer) and its
    old-log-prob forward, medians of --stock-iters after a warm-up; written to --out/megatron_gpt.json."""
    try:
        shape = batch_shape(rows, skip=1)
        trainer = job_trainer(args.overrides)
    except (KeyError, ZeroDivisionError, ValueError) as e:
        rec = {"status": f"no batch for the worker from the non-TOP job ({type(e).__name__}: {e})"}
        (out / "megatron_gpt.json").write_text(json.dumps(rec, indent=1))
        return rec
    cmd = [sys.executable, "-u", str(ROOT / "bench" / "_trainer_worker.py"), "--impl", "stock",
           "--model", args.stock_model, "--batch-shape", ",".join(map(str, shape)), "--recompute", trainer["recompute"],
           "--mbt-on", str(trainer["micro_batch_tokens"]), "--warmup", "1", "--iters", str(args.stock_iters),
           "--device", args.stock_device, "--attention", args.stock_attention, "--old-logprob-forward"]
    rec = {"shape": shape, "model": args.stock_model, "attention": args.stock_attention, **trainer,
           "status": "no result"}
    t0 = time.perf_counter()
    with open(out / "megatron_gpt.log", "w") as log:
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, timeout=args.stock_timeout,
                                  cwd=ROOT)  # the worker puts the repo on its path; PYTHONPATH is kept
            for line in proc.stdout.splitlines():
                kind, _, rest = line.partition(" ")
                if kind in ("RESULT", "NOTE"):
                    rec.setdefault(kind.lower() + "s", []).append(json.loads(rest))
            result = next((r for r in rec.get("results", []) if r.get("status") == "ok"), None)
            if result:
                rec.update(status="ok", step_s=result["step_ms"] / 1e3, old_logprob_s=result["old_logprob_ms"] / 1e3,
                           tokens_per_s=result["tokens_per_s"])
            else:
                rec["status"] = f"exit {proc.returncode}: " + "; ".join(r["status"] for r in rec.get("results", []))
        except subprocess.TimeoutExpired:
            rec["status"] = f"stopped at --stock-timeout {args.stock_timeout:g} s"
    print(f"[compare] Megatron GPT trainer on {shape[0]} x ({shape[1]} + {shape[2]}) tokens: {rec['status']} after "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    (out / "megatron_gpt.json").write_text(json.dumps(rec, indent=1))
    return rec


def recorded(out: Path, jobs) -> tuple[dict[str, list[dict]], dict | None]:
    """Each job's rows and the Megatron GPT trainer's record, as --out holds them."""
    results = {}
    for job in jobs:
        path = out / f"metrics_{job.slug}.jsonl"
        if path.exists():
            results[job.name] = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    path = out / "megatron_gpt.json"
    return results, json.loads(path.read_text()) if path.exists() else None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--run-root", default="/tmp/rl_step_compare")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=1024, help="the GSM8K job's 1024 by default")
    ap.add_argument("--job-timeout", type=float, default=0, help="seconds per job (0: none)")
    ap.add_argument("--only", choices=[TOP.name, NON_TOP.name, "megatron_gpt"], action="append",
                    help="run these only (megatron_gpt: the Megatron GPT trainer on the non-TOP rows in --out)")
    ap.add_argument("--report", action="store_true", help="run nothing: the table from what --out holds")
    ap.add_argument("--non-top-attention", default=NON_TOP.attention_backend,
                    help="the non-TOP server's --attention-backend (SGLang's Hopper default fa3; another only where "
                         "fa3 does not run in default mode, and then say so with the numbers)")
    ap.add_argument("--stock-model", default="qwen3-0.6b", help="bench/_trainer_common.py MODELS: the job's shape")
    ap.add_argument("--stock-device", default="cuda")
    ap.add_argument("--stock-attention", default="flash", help="bench/_stock_attention.py: flash | efficient | "
                    "cudnn | math")
    ap.add_argument("--stock-iters", type=int, default=3)
    ap.add_argument("--stock-timeout", type=float, default=240)
    ap.add_argument("--launcher", nargs="+", default=[sys.executable, "-m", "top_rl.cli"],
                    help="the command that runs a job (tests give a stand-in)")
    ap.add_argument("overrides", nargs="*", help="more top-rl overrides for both jobs (after --)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in args.out.glob("rl_step_compare*.md"):  # this call's tables only (a later call may find fewer rows)
        stale.unlink()
    jobs = {job.name: job for job in (TOP, dataclasses.replace(NON_TOP, attention_backend=args.non_top_attention))}
    wanted = lambda name: not args.report and (not args.only or name in args.only)  # noqa: E731
    for job in jobs.values():
        if wanted(job.name):
            run_job(job, args, args.out)
    results, megatron = recorded(args.out, jobs.values())
    if wanted("megatron_gpt") and results.get(NON_TOP.name):
        megatron = run_megatron_gpt(results[NON_TOP.name], args, args.out)
    if all(len(results.get(n) or []) >= 2 for n in jobs):  # a warm-up step and at least one timed, both jobs
        text = table(results, skip=1, out=args.out, megatron=megatron, columns=sides(jobs[NON_TOP.name]))
        print(text)
        (args.out / "rl_step_compare.md").write_text(text + "\n")
        return
    for name, rows in results.items():  # what did run still reaches --out, part by part
        text = partial_table(jobs[name], rows, skip=1, out=args.out)
        print(text)
        (args.out / f"rl_step_compare_{jobs[name].slug}.md").write_text(text + "\n")
    print("[compare] a job has fewer than 2 steps in --out: no side-by-side table; see its log there", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
