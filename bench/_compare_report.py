"""bench/rl_step_compare.py's report: the side-by-side table (each part's median seconds per column, TOP / column per
part and for the step) and the lines under it (the card and releases, each job's server command, generated and trained tok/s,
parity, memory, the Megatron GPT trainer's record, the kernels each job's trainer ran); one job's parts alone when the
other has no rows."""

from __future__ import annotations

import contextlib
import json
import statistics
from importlib import metadata
from pathlib import Path

from bench._compare_sides import PARTS, TRAIN_KEYS, Job, Side, sides

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
    trained = lambda rows: statistics.median(r.get("perf/trained_tokens_per_s", 0.0) for r in rows[skip:] or rows)  # noqa
    par = [r.get("train/train_rollout_logprob_abs_diff") for r in results["TOP"]]
    ess = [r.get("train/ess_ratio") for r in results["TOP"]]
    jobs = {s.job.name: s.job for s in columns}
    lines += ["", machine_line(),
              "generated tok/s (median): " + ", ".join(f"{n} {gen(results[n]):,.0f}" for n in jobs),
              # the job's trainer against bench/trainer_step.py's tok/s (issue 31): tokens trained / the train call
              "trained tok/s, the train call (median): " + ", ".join(f"{n} {trained(results[n]):,.0f}" for n in jobs),
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
