"""The whole RL step, TOP against what users run without it, side by side: the same job (GSM8K, a random Qwen3-0.6B
shape, one GPU shared by a live SGLang server and the trainer), the same prompts and seeds, every part of the step.

Two top-rl jobs run (TOP and NON_TOP, one typed Job each); the table's columns (sides(), one typed Side each) use them:
  TOP                  the shipped default: the contract's rl mode on the server, `top.attention_backend=auto`
                       (fa3 with the decode log-probs on Hopper under 0.5.11's contract) and the trainer on the
                       engine's kernels; PPO's old policy = the rollout's log-probs, proven equal by the gate
  non-TOP              SGLang's default mode (`top.enabled=false`: no determinism flag, radix cache and CUDA graphs on,
                       attention fa3, SGLang's Hopper default, named so that the bundle's FA3 runs; --non-top-attention
                       picks another where fa3 does not run) and our Qwen3 trainer on the `stock` kernels
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
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Both jobs are the shipped one-GPU GSM8K recipe (64 prompts x 8 samples, the GPU handed between server and trainer,
# CUDA graphs and running requests up to the whole batch, the server's share sized for the card: `auto`) on a random
# Qwen3-0.6B shape, without checkpoints
JOB = ["+experiment=gsm8k_qwen3_0.6b_one_gpu", "model.path=null", "checkpoint.every=0", "tracking.wandb_mode=disabled",
       "tracking.console=true"]


@dataclass(frozen=True)
class Job:
    """One top-rl run of the compare: the server's mode and the trainer's kernels, as top-rl overrides."""

    name: str
    top: bool  # the TOP contract on both sides; False: `top.enabled=false`, SGLang's default mode and `stock` kernels
    attention_backend: str  # the server's --attention-backend (auto: the shipped choice for the GPU)
    logprob_source: str  # auto | decode | prefill: which log-probs the rollout returns
    radix_cache: bool
    old_logprob_forward: bool  # algo.old_logprobs=recompute: a forward of the batch before the update

    def overrides(self) -> list[str]:
        return ([] if self.top else ["top.enabled=false"]) + [
            f"top.attention_backend={self.attention_backend}", f"rollout.logprob_source={self.logprob_source}",
            f"rollout.sglang.disable_radix_cache={str(not self.radix_cache).lower()}",
            f"algo.old_logprobs={'recompute' if self.old_logprob_forward else 'rollout'}"]

    @property
    def slug(self) -> str:
        return self.name.replace(" ", "_")


@dataclass(frozen=True)
class Side:
    """One column of the table: a job's rollout, weight sync and the rest of its step, with a trainer."""

    name: str
    job: Job
    trainer: str  # "job": the job's own trainer; "megatron_gpt": bench/_stock_gpt.py's, timed on the job's batch
    old_logprob_forward: bool  # whether the column pays the old-log-prob forward


TOP = Job("TOP", top=True, attention_backend="auto", logprob_source="auto", radix_cache=False,
          old_logprob_forward=False)
NON_TOP = Job("non-TOP", top=False, attention_backend="fa3", logprob_source="decode", radix_cache=True,
              old_logprob_forward=True)


def sides(non_top: Job = NON_TOP) -> list[Side]:
    """The table's columns: TOP, then the non-TOP job with each trainer, with and without the old-log-prob forward."""
    return [Side("TOP", TOP, "job", False),
            Side("non-TOP, Qwen3 stock, + old-lp fwd", non_top, "job", True),
            Side("non-TOP, Qwen3 stock", non_top, "job", False),
            Side("non-TOP, Megatron GPT, + old-lp fwd", non_top, "megatron_gpt", True),
            Side("non-TOP, Megatron GPT", non_top, "megatron_gpt", False)]


PARTS = ("rollout (generate)", "old-log-prob forward", "train fwd+bwd+optim", "weight sync", "other")
TRAIN_KEYS = ("perf/trainer/forward_backward_s", "perf/trainer/gate_s", "perf/trainer/optimizer_s")


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


# ------------------------------------------------------------------------------------------------ the table
def side_rows(side: Side, rows: list[dict], megatron: dict | None) -> list[dict[str, float]] | None:
    """The side's parts and step, one dict per job step (None: its trainer has no measurement). The job's own
    trainer: its train call's forward+backward, gate and optimizer; the Megatron GPT trainer's replace them (and its
    old-log-prob forward the job's). `other` is what the step spent beside the parts (driver, Ray calls, GPU handoff,
    the trainer's offload and onload)."""
    if side.trainer == "megatron_gpt" and (megatron or {}).get("status") != "ok":
        return None
    out = []
    for r in rows:
        job_old = r.get("perf/trainer/old_logprobs_s", 0.0)
        job_train = sum(r.get(k, 0.0) for k in TRAIN_KEYS)
        parts = {"rollout (generate)": r.get("perf/rollout_time", 0.0),
                 "weight sync": r.get("perf/weight_push_time", 0.0)}
        parts["other"] = r.get("perf/step_time", 0.0) - job_old - job_train - sum(parts.values())
        if side.trainer == "job":
            parts["old-log-prob forward"], parts["train fwd+bwd+optim"] = job_old, job_train
        else:
            parts["old-log-prob forward"], parts["train fwd+bwd+optim"] = megatron["old_logprob_s"], megatron["step_s"]
        if not side.old_logprob_forward:
            parts["old-log-prob forward"] = 0.0
        out.append({**parts, "step": sum(parts.values())})
    return out


def medians(per_step: list[dict[str, float]], skip: int) -> dict[str, float]:
    timed = per_step[skip:] or per_step
    return {key: statistics.median(r[key] for r in timed) for key in (*PARTS, "step")}


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 and a > 0 else "-"


def table(results: dict[str, list[dict]], skip: int, out: Path | None = None, megatron: dict | None = None,
          columns: list[Side] | None = None) -> str:
    """The side-by-side table: each part's median seconds per column, TOP / column per part and for the step."""
    columns = columns or sides()
    med = {}
    for side in columns:
        per_step = side_rows(side, results[side.job.name], megatron)
        if per_step is not None:
            med[side.name] = medians(per_step, skip)
    shown = [s for s in columns if s.name in med]
    top = med["TOP"]
    lines = ["### TOP against non-TOP, one RL step (median seconds over the steps after the first)", "",
             "| part | " + " | ".join(s.name for s in shown) + " |", "|---|" + "---|" * len(shown)]
    for key in (*PARTS, "step"):
        b = "**" if key == "step" else ""
        lines.append(f"| {b}{key}{b} | " + " | ".join(f"{b}{med[s.name][key]:.2f}{b}" for s in shown) + " |")
    others = [s for s in shown if s.name != "TOP"]
    lines += ["", "| TOP / column | " + " | ".join(s.name for s in others) + " |", "|---|" + "---|" * len(others)]
    for key in (*PARTS, "step"):
        b = "**" if key == "step" else ""
        lines.append(f"| {b}{key}{b} | " + " | ".join(f"{b}{ratio(top[key], med[s.name][key])}{b}" for s in others)
                     + " |")
    gen = lambda rows: statistics.median(r.get("perf/rollout_tokens_per_s", 0.0) for r in rows[skip:] or rows)  # noqa
    par = [r.get("train/train_rollout_logprob_abs_diff") for r in results["TOP"]]
    ess = [r.get("train/ess_ratio") for r in results["TOP"]]
    jobs = {s.job.name: s.job for s in columns}
    lines += ["", machine_line(),
              "generated tok/s (median): " + ", ".join(f"{n} {gen(results[n]):,.0f}" for n in jobs),
              f"TOP: {len(par)} steps, abs_diff == 0 on every step: {all(d == 0.0 for d in par)}, ess == 1 on every "
              f"step: {all(e == 1.0 for e in ess)}; non-TOP abs_diff (median): "
              f"{statistics.median(r.get('train/train_rollout_logprob_abs_diff', 0.0) for r in results['non-TOP']):.3g}",
              *(f"{n}: " + memory_line(results[n], skip) for n in jobs),
              *(server_lines(out, jobs.values()) if out else []), megatron_line(megatron),
              *kernel_lines(out, jobs)]
    return "\n".join(lines)


def machine_line() -> str:
    """The card (NVML, no CUDA context) and the releases that ran."""
    from top_rl import sglang_release
    from top_rl.driver.local_gpu import local_gpu

    gpu = local_gpu()

    def version(dist: str) -> str:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(dist)
        return "not installed"

    return (f"card: {gpu.describe() if gpu else 'no GPU visible'}; releases: torch {version('torch')}, sglang "
            f"{sglang_release.installed_version() or 'not installed'}, megatron-core {version('megatron-core')}")


def server_lines(out: Path, jobs) -> list[str]:
    lines = []
    for job in jobs:
        try:
            plan = json.loads((out / f"server_{job.slug}.json").read_text())
        except (OSError, ValueError):
            lines.append(f"{job.name} server: not recorded")
            continue
        if "error" in plan:
            lines.append(f"{job.name} server: its config was refused ({plan['error']})")
            continue
        argv = plan["argv"]
        flags = " ".join(argv[argv.index("--tp-size"):]) if "--tp-size" in argv else " ".join(argv)
        env = " ".join(f"{k}={v}" for k, v in sorted(plan["env"].items())) or "none"
        lines.append(f"{job.name} server: {flags} (env: {env}; attention {plan['attention']['backend']}, "
                     f"{plan['attention']['logprob_source']} log-probs; contract {plan['contract'] or 'none'}, SGLang "
                     f"{plan['sglang_release']})")
    return lines


def megatron_line(megatron: dict | None) -> str:
    if not megatron:
        return "Megatron GPT trainer: not run (its columns are left out)"
    if "shape" not in megatron:
        return f"Megatron GPT trainer: {megatron.get('status')} (its columns are left out)"
    n, p, r = megatron["shape"]
    head = (f"Megatron GPT trainer (bench/_stock_gpt.py, {megatron['model']}, attention {megatron['attention']}, "
            f"recompute {megatron['recompute']}, {megatron['micro_batch_tokens']}-token micro-batches) on the non-TOP "
            f"job's batch shape, {n} samples x ({p} prompt + {r} response) tokens, in its own process after the job")
    if megatron.get("status") != "ok":
        return f"{head}: {megatron.get('status')} (its columns are left out)"
    return (f"{head}: step {megatron['step_s']:.2f} s ({megatron['tokens_per_s']:,.0f} tok/s), old-log-prob forward "
            f"{megatron['old_logprob_s']:.2f} s")


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


def kernel_lines(out: Path | None, names) -> list[str]:
    return [] if out is None else [f"{name} trainer kernels: {trainer_kernels(out, name)}" for name in names]


def memory_line(rows: list[dict], skip: int) -> str:
    """The GPU's memory beside the seconds (medians): what the trainer keeps between steps and its step's peak, and
    the server's peak KV-pool use (a layout that does not fit shows here before it fails)."""
    timed = rows[skip:] or rows
    med = lambda key: statistics.median(r.get(key, float("nan")) for r in timed)  # noqa: E731
    return (f"trainer resident after the step {med('perf/trainer/gpu_resident_gib'):.1f} GiB, trainer peak "
            f"{med('perf/trainer/gpu_peak_gib'):.1f} GiB, server peak KV-pool use {med('perf/rollout_peak_kv_use'):.2f}, "
            f"peak running requests {med('perf/rollout_peak_running_requests'):.0f}")


def partial_table(job: Job, rows: list[dict], skip: int, out: Path | None = None) -> str:
    """One job's parts alone (the other has no rows): medians over the steps after the first, or step 1's."""
    name = job.name
    med = medians(side_rows(Side(name, job, "job", job.old_logprob_forward), rows, None), skip)
    lines = [f"### {name} alone, {len(rows)} steps (median seconds{' after the first' if len(rows) > skip else ''})",
             "", "| part | seconds |", "|---|---|", *(f"| {key} | {med[key]:.2f} |" for key in (*PARTS, "step")),
             "", memory_line(rows, skip), *kernel_lines(out, [name])]
    return "\n".join(lines)


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
