"""The whole RL step, TOP against non-TOP, side by side in one call: the same job (GSM8K, a random Qwen3-0.6B shape,
one GPU shared by a live SGLang server and the trainer), the same prompts and seeds, every part of the step.

  TOP       the contract's rl mode on the server (deterministic kernels, radix cache off) and the trainer on the
            engine's kernels; PPO's old policy = the rollout's log-probs, proven equal to the trainer's by the gate
  non-TOP   `top.enabled=false`: SGLang's default fast kernels as users run them (radix cache and CUDA graphs on) and
            the trainer on the `stock` kernels (top_rl/kernels/stock.py: varlen flash attention, Liger's RMSNorm, a
            chunked log-prob; cuBLAS GEMMs); run with `algo.old_logprobs=recompute`, the separate old-log-prob
            forward verl and slime run by default. "non-TOP, no recompute" (rollout log-probs as the old policy, the
            fastest possible) is the same run without that pass: its step less `perf/trainer/old_logprobs_s`.

Each job runs `--steps` steps; the first (server warm-up, first-use compilation) is left out and the rest give
medians. Prints one table: each part's median seconds per setting and TOP / non-TOP per part and for the step, and
under it the kernels each side's trainer ran (its run_dir/kernels.json, trainer rank 0: the backend and the path each
op took, with any fallback), copied to --out as kernels_<setting>.json.

    python bench/rl_step_compare.py --out DIR [--steps 4] [--max-new-tokens 512] [--job-timeout 280] [-- overrides]
(on the H200: `bash scripts/gpu_run.sh bench-compare`)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

# Both sides lay the GPU out alike: the GPU handed between server and trainer, CUDA graphs and running requests up to
# the whole batch (scripts/gpu_run.sh's GSM8K job), the server at 0.6 of the GPU: at 0.7 the server beside the
# trainer's resident memory (37 GiB seen in session 10, before the trainer's first-step empty_cache) ran out of memory
# in a re-score at step 3; the KV pool at 0.6 still holds the whole batch at 512 new tokens
JOB = ["+experiment=gsm8k_qwen3_0.6b", "model.path=null", "rollout.num_engines=1", "cluster.colocate=true",
       "cluster.engine_gpus=0.5", "cluster.trainer_gpus=0.5", "cluster.gpu_handoff=true",
       "rollout.sglang.mem_fraction_static=0.6", "rollout.sglang.cuda_graph_max_bs=512",
       "rollout.sglang.max_running_requests=512", "checkpoint.every=0", "tracking.wandb_mode=disabled",
       "tracking.console=true"]
SETTINGS = {
    "TOP": [],
    "non-TOP": ["top.enabled=false", "rollout.sglang.disable_radix_cache=false", "algo.old_logprobs=recompute"],
}
PARTS = [("rollout", "perf/rollout_time"), ("  of it: re-score tail", "perf/rollout_rescore_tail_s"),
         ("old-log-prob forward", "perf/trainer/old_logprobs_s"),
         ("trainer forward+backward", "perf/trainer/forward_backward_s"), ("gate", "perf/trainer/gate_s"),
         ("optimizer", "perf/trainer/optimizer_s"), ("train call (all of the trainer)", "perf/train_time"),
         ("GPU handoff", "perf/gpu_handoff_time"), ("weight push", "perf/weight_push_time"),
         ("step", "perf/step_time")]


def run_job(name: str, extra: list[str], args, out: Path) -> list[dict]:
    """One job to its end or its --job-timeout (then stopped: SIGTERM, SIGKILL after a grace); its rows are kept
    either way, and its server's last log lines go into its log in --out (a server that died says why there)."""
    slug = name.replace(" ", "_")
    run_dir = Path(args.run_root) / slug
    server_log = run_dir.parent / f"{slug}.sglang.log"  # beside run_dir: a fresh run_dir must not exist yet
    server_log.unlink(missing_ok=True)
    cmd = [*args.launcher, f"run_dir={run_dir}", f"steps={args.steps}",
           f"rollout.max_new_tokens={args.max_new_tokens}", f"rollout.sglang.log_path={server_log}", *JOB, *extra,
           *args.overrides]
    log = out / f"compare_{slug}.log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.job_timeout or None)
        except subprocess.TimeoutExpired:
            rc = stop(proc)
            print(f"[compare] {name}: stopped at --job-timeout {args.job_timeout:g} s (exit {rc})", flush=True)
    if server_log.exists():
        tail = server_log.read_text(errors="replace").splitlines()[-60:]
        with open(log, "a") as f:
            f.write(f"\n[compare] the server's last {len(tail)} log lines ({server_log}):\n" + "\n".join(tail) + "\n")
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    print(f"[compare] {name}: exit {rc} after {time.perf_counter() - t0:.0f} s, {len(rows)} steps ({' '.join(extra)})",
          flush=True)
    if rows:
        (out / f"metrics_{slug}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if (run_dir / "kernels.json").exists():
        (out / f"kernels_{slug}.json").write_text((run_dir / "kernels.json").read_text())
    return rows


def trainer_kernels(out: Path, name: str) -> str:
    """What `name`'s trainer ran, from the kernels.json its job wrote (trainer ranks first, then engines): rank 0's
    backend, the path each op took and the fallbacks; "not recorded" when the job wrote none."""
    path = out / f"kernels_{name.replace(' ', '_')}.json"
    try:
        report = json.loads(path.read_text())[0]
    except (OSError, ValueError, IndexError, KeyError):
        return "not recorded (no kernels.json)"
    paths = ", ".join(f"{op} {p}" for op, p in sorted(report.get("paths", {}).items())) or "no op recorded"
    falls = report.get("fallbacks", {})
    return (f"backend {report.get('backend')} ({paths}); "
            + (f"fell back: {'; '.join(f'{op}: {e}' for op, e in falls.items())}" if falls else "no fallback"))


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


def medians(rows: list[dict], skip: int) -> dict[str, float]:
    timed = rows[skip:] or rows
    return {key: statistics.median(r.get(key, 0.0) for r in timed) for _, key in PARTS}


def kernel_lines(out: Path | None, names) -> list[str]:
    return [] if out is None else [f"{name} trainer kernels: {trainer_kernels(out, name)}" for name in names]


def table(results: dict[str, list[dict]], skip: int, out: Path | None = None) -> str:
    top, base = medians(results["TOP"], skip), medians(results["non-TOP"], skip)
    fast = dict(base)  # non-TOP without the separate old-log-prob forward
    for key in ("perf/trainer/old_logprobs_s",):
        fast["perf/train_time"] -= base[key]
        fast["perf/step_time"] -= base[key]
        fast[key] = 0.0
    ratio = lambda a, b: f"{a / b:.2f}" if b > 0 else "-"  # noqa: E731
    lines = ["### TOP vs non-TOP, one RL step (median seconds over the steps after the first)", "",
             "| part | TOP | non-TOP + old-log-prob forward | non-TOP, rollout log-probs as old | TOP / non-TOP (+fwd) "
             "| TOP / non-TOP (no fwd) |", "|---|---|---|---|---|---|"]
    for label, key in PARTS:
        bold = "**" if key == "perf/step_time" else ""
        lines.append(f"| {bold}{label}{bold} | {top[key]:.2f} | {base[key]:.2f} | {fast[key]:.2f} | "
                     f"{ratio(top[key], base[key])} | {ratio(top[key], fast[key])} |")
    par = [r.get("train/train_rollout_logprob_abs_diff") for r in results["TOP"]]
    ess = [r.get("train/ess_ratio") for r in results["TOP"]]
    gen = lambda rows: statistics.median(r.get("perf/rollout_tokens_per_s", 0.0) for r in rows[skip:] or rows)  # noqa
    lines += ["", f"TOP: {len(par)} steps, abs_diff == 0 on every step: {all(d == 0.0 for d in par)}, ess == 1 on "
                  f"every step: {all(e == 1.0 for e in ess)}; non-TOP abs_diff (median): "
                  f"{statistics.median(r.get('train/train_rollout_logprob_abs_diff', 0.0) for r in results['non-TOP']):.3g}",
              f"generated tok/s (median): TOP {gen(results['TOP']):,.0f}, non-TOP {gen(results['non-TOP']):,.0f}",
              *(f"{name}: " + memory_line(rows, skip) for name, rows in results.items()),
              *kernel_lines(out, results)]
    return "\n".join(lines)


def memory_line(rows: list[dict], skip: int) -> str:
    """The GPU's memory beside the seconds (medians): what the trainer keeps between steps and its step's peak, and
    the server's peak KV-pool use (a layout that does not fit shows here before it fails)."""
    timed = rows[skip:] or rows
    med = lambda key: statistics.median(r.get(key, float("nan")) for r in timed)  # noqa: E731
    return (f"trainer resident after the step {med('perf/trainer/gpu_resident_gib'):.1f} GiB, trainer peak "
            f"{med('perf/trainer/gpu_peak_gib'):.1f} GiB, server peak KV-pool use {med('perf/rollout_peak_kv_use'):.2f}, "
            f"peak running requests {med('perf/rollout_peak_running_requests'):.0f}")


def partial_table(name: str, rows: list[dict], skip: int, out: Path | None = None) -> str:
    """One setting's parts alone (the other job failed): medians over the steps after the first, or step 1's."""
    med = medians(rows, skip)
    lines = [f"### {name} alone, {len(rows)} steps (median seconds{' after the first' if len(rows) > skip else ''})",
             "", "| part | seconds |", "|---|---|", *(f"| {label} | {med[key]:.2f} |" for label, key in PARTS),
             "", memory_line(rows, skip), *kernel_lines(out, [name])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--run-root", default="/tmp/rl_step_compare")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--job-timeout", type=float, default=0, help="seconds per job (0: none)")
    ap.add_argument("--only", choices=sorted(SETTINGS), action="append", help="run these settings only")
    ap.add_argument("--launcher", nargs="+", default=[sys.executable, "-m", "top_rl.cli"],
                    help="the command that runs a job (tests give a stand-in)")
    ap.add_argument("overrides", nargs="*", help="more top-rl overrides for both jobs (after --)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {name: run_job(name, extra, args, args.out) for name, extra in SETTINGS.items()
               if not args.only or name in args.only}
    if all(len(results.get(n) or []) >= 2 for n in SETTINGS):  # a warm-up step and at least one timed
        text = table(results, skip=1, out=args.out)
        print(text)
        (args.out / "rl_step_compare.md").write_text(text + "\n")
    else:
        for name, rows in results.items():  # what did run still reaches --out, part by part
            if rows:
                text = partial_table(name, rows, skip=1, out=args.out)
                print(text)
                (args.out / f"rl_step_compare_{name.replace(' ', '_')}.md").write_text(text + "\n")
        print("[compare] a job gave fewer than 2 steps: no side-by-side table; see its log in --out", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
