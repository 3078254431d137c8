"""`top-rl-report run_dir=R`: one self-contained HTML page of a run, to look at without wandb (no JavaScript, no CDN,
no network: inline SVG and CSS only, so it opens from a laptop's disk or a CI artifact as it is).

It reads what a run writes: metrics.jsonl (one row per step) and, where rollout.save_samples_every wrote them,
samples/step_NNNNNN.jsonl.gz. Sections: a summary, the reward and eval curves, parity per step (abs_diff, ESS: the
TOP guarantee, 0 and 1 on a gated run), where a step's time goes, lengths and truncation, DAPO's dynamic sampling
where on, the learning rate, and a few generations of the latest saved step. A chart appears only for keys the run
logged. Writes run_dir/report.html (or out=); refusals are one line naming the file and the fix."""

from __future__ import annotations

import gzip
import html
import json
import math
import sys
from pathlib import Path

from top_rl.atomic import write_file
from top_rl.tools.args import Arg, KeyValueCli, UsageError

CLI = KeyValueCli("top-rl-report", "Write one self-contained HTML report of a run (curves, parity, time, lengths, "
                  "generations) from its metrics.jsonl and samples/.", [
                      Arg("run_dir", "the run's directory (its metrics.jsonl)", required=True),
                      Arg("out", "the HTML file to write (default RUN_DIR/report.html)"),
                      Arg("generations", "generations shown from the latest samples/ file", int, 8),
                  ], epilog="Online plots: `wandb sync RUN_DIR/wandb/offline-run-*` uploads the run's wandb history.")

# One chart's size, and the room around its plot: left for the y labels (0.0003806 fits), below for the x labels and
# "step", above for the title and the legend (its own rows, never over the lines; screenshot-checked, issue 52)
W, H, LEFT, RIGHT, BOTTOM = 520, 240, 64, 16, 36
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")
TIME_KEYS = ("perf/rollout_time", "perf/train_time", "perf/weight_push_time", "perf/gpu_handoff_time",
             "perf/eval_time")


class ReportError(ValueError):
    pass


def load_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ReportError(f"{path} does not exist: run_dir= must be a run's directory (the one `top-rl run_dir=...` "
                          "wrote)")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rows.append(json.loads(line))
        except ValueError:  # a row torn by a kill: the resume rewrites it; the report skips it
            continue
    if not rows:
        raise ReportError(f"{path} holds no rows yet: the run has not finished a step")
    return rows


def latest_samples(run_dir: Path, limit: int) -> tuple[int | None, list[dict]]:
    files = sorted((run_dir / "samples").glob("step_*.jsonl.gz"))
    if not files or limit <= 0:
        return None, []
    with gzip.open(files[-1], "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for _, line in zip(range(limit), f)]
    return int(files[-1].name[5:11]), rows


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def series(rows: list[dict], key: str) -> list[tuple[float, float]]:
    return [(r["step"], float(r[key])) for r in rows if _num(r.get(key))]


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _legend(names: list[str]) -> tuple[list[tuple[float, float, str]], int]:
    """Where each name's legend entry goes: (x, y, name) in rows under the title, wrapped at the chart's width."""
    out, x, y = [], LEFT, 34
    for name in names:
        width = 22 + 6 * len(name)  # a 16 px swatch, and about 6 px a character at font-size 10
        if x > LEFT and x + width > W - RIGHT:
            x, y = LEFT, y + 13
        out.append((x, y, name))
        x += width + 12
    return out, y


def chart(title: str, lines: dict[str, list[tuple[float, float]]]) -> str:
    """An SVG line chart of named (step, value) series; '' when none has a point."""
    lines = {k: v for k, v in lines.items() if v}
    if not lines:
        return ""
    xs = [x for pts in lines.values() for x, _ in pts]
    ys = [y for pts in lines.values() for _, y in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:  # a flat line (abs_diff 0 all run) drawn mid-chart, its value on the axis
        y0, y1 = y0 - 1, y1 + 1
    legend, legend_bottom = _legend(list(lines))
    top = legend_bottom + 14  # the plot starts below the legend

    def px(x, y):
        return (LEFT + (x - x0) / (x1 - x0) * (W - LEFT - RIGHT), top + (y1 - y) / (y1 - y0) * (H - BOTTOM - top))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img">',
           f'<title>{html.escape(title)}</title>',
           f'<text x="{W / 2}" y="16" text-anchor="middle" class="t">{html.escape(title)}</text>']
    for y in (y0, (y0 + y1) / 2, y1):  # the y labels, each with a faint grid line across the plot
        _, yy = px(x0, y)
        out.append(f'<line x1="{LEFT}" y1="{yy:.1f}" x2="{W - RIGHT}" y2="{yy:.1f}" class="g"/>')
        out.append(f'<text x="{LEFT - 4}" y="{yy + 3.5:.1f}" text-anchor="end" class="l">{_fmt(y)}</text>')
    out += [f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" class="ax"/>',
            f'<line x1="{LEFT}" y1="{top}" x2="{LEFT}" y2="{H - BOTTOM}" class="ax"/>']
    ticks = sorted({x0, x1, *([round((x0 + x1) / 2)] if x1 - x0 >= 4 else [])})
    for x in ticks:
        xx, _ = px(x, y0)
        out.append(f'<text x="{xx:.1f}" y="{H - BOTTOM + 14}" text-anchor="middle" class="l">{_fmt(x)}</text>')
    out.append(f'<text x="{LEFT + (W - LEFT - RIGHT) / 2}" y="{H - 6}" text-anchor="middle" class="l">step</text>')
    for i, ((name, pts), (lx, ly, _)) in enumerate(zip(lines.items(), legend)):
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{a:.1f},{b:.1f}" for a, b in (px(x, y) for x, y in pts))
        if len(pts) == 1:
            a, b = px(*pts[0])
            out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"/>')
        else:
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{path}"/>')
        out.append(f'<line x1="{lx}" y1="{ly - 3.5}" x2="{lx + 16}" y2="{ly - 3.5}" stroke="{color}" '
                   f'stroke-width="2"/>')
        out.append(f'<text x="{lx + 20}" y="{ly}" class="l" fill="{color}">{html.escape(name)}</text>')
    return "\n".join(out + ["</svg>"])


def _section(ident: str, title: str, body: str) -> str:
    return f'<section id="{ident}"><h2>{html.escape(title)}</h2>\n{body}\n</section>' if body.strip() else ""


def _charts(rows, specs) -> str:
    return "\n".join(chart(title, {k.split("/", 1)[-1]: series(rows, k) for k in keys}) for title, keys in specs)


def _time_table(rows) -> str:
    """Mean seconds of each part of a step, and its share of perf/step_time."""
    step = [r["perf/step_time"] for r in rows if _num(r.get("perf/step_time"))]
    if not step:
        return ""
    mean_step = sum(step) / len(step)
    out = ["<table><tr><th>part</th><th>mean s</th><th>share of step</th></tr>"]
    for key in TIME_KEYS:
        vals = [r[key] for r in rows if _num(r.get(key))]
        if vals:
            m = sum(vals) / len(vals)
            out.append(f"<tr><td>{key}</td><td>{_fmt(m)}</td><td>{100 * m / mean_step:.1f}%</td></tr>")
    out.append(f"<tr><td>perf/step_time</td><td>{_fmt(mean_step)}</td><td>100%</td></tr></table>")
    return "\n".join(out)


def _summary(rows) -> str:
    last = rows[-1]
    abs_diff = [r["train/train_rollout_logprob_abs_diff"] for r in rows
                if _num(r.get("train/train_rollout_logprob_abs_diff"))]
    items = [("steps logged", f"{len(rows)} (last step {last['step']})"),
             ("last reward mean", _fmt(last["rollout/reward_mean"]) if _num(last.get("rollout/reward_mean")) else "-"),
             ("max abs_diff over the run", repr(max(abs_diff)) if abs_diff else "-"),
             ("wall time", f"{_fmt(last['perf/wall_time'])} s" if _num(last.get("perf/wall_time")) else "-")]
    evals = [r for r in rows if _num(r.get("eval/accuracy"))]
    if evals:
        items.append(("last eval accuracy", f"{_fmt(evals[-1]['eval/accuracy'])} (step {evals[-1]['step']})"))
    return "<table>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in items) + \
        "</table>"


def _generations(step, samples) -> str:
    if not samples:
        return "<p>No generations on disk (rollout.save_samples_every=K writes them).</p>"
    head = f"<p>Step {step}, its first {len(samples)} samples (samples/step_{step:06d}.jsonl.gz).</p><table>"
    head += "<tr><th>group</th><th>prompt</th><th>response</th><th>reward</th><th>advantage</th><th>length</th></tr>"
    body = "".join(
        f"<tr><td>{s.get('group')}</td><td><pre>{html.escape(str(s.get('prompt', '')))}</pre></td>"
        f"<td><pre>{html.escape(str(s.get('response', '')))}</pre></td><td>{_fmt(s.get('reward', float('nan')))}</td>"
        f"<td>{_fmt(s.get('advantage', float('nan')))}</td><td>{s.get('length')}</td></tr>" for s in samples)
    return head + body + "</table>"


def render(run_dir: Path, generations: int = 8) -> str:
    rows = load_rows(run_dir)
    eval_keys = sorted({k for r in rows for k in r if k.startswith("eval/pass@") or k == "eval/accuracy"})
    step, samples = latest_samples(run_dir, generations)
    parts = [
        _section("summary", "Summary", _summary(rows)),
        _section("reward", "Reward", _charts(rows, [
            ("reward (mean, min, max)", ["rollout/reward_mean", "rollout/reward_min", "rollout/reward_max"]),
            ("reward std, groups with one reward", ["rollout/reward_std", "rollout/groups_one_reward_frac"])])),
        _section("eval", "Eval", _charts(rows, [("eval accuracy and pass@k", eval_keys),
                                                 ("eval response length", ["eval/response_len_mean"])])),
        _section("parity", "Parity (TOP: abs_diff 0, ESS 1)", _charts(rows, [
            ("train vs rollout log-prob abs_diff", ["train/train_rollout_logprob_abs_diff",
                                                    "train/train_rollout_logprob_abs_diff_max"]),
            ("ESS ratio", ["train/ess_ratio"])])),
        _section("time", "Where a step's time goes", _time_table(rows) + _charts(rows, [
            ("seconds per step", ["perf/step_time", *TIME_KEYS])])),
        _section("lengths", "Lengths and truncation", _charts(rows, [
            ("response length (mean, max)", ["rollout/response_len_mean", "rollout/response_len_max"]),
            ("truncated fraction", ["rollout/truncated_frac"])])),
        _section("dynamic", "DAPO dynamic sampling", _charts(rows, [
            ("groups per step", ["rollout/dynamic_dropped_groups", "rollout/dynamic_filled_groups",
                                 "rollout/dynamic_rounds"])])),
        _section("train", "Training", _charts(rows, [("learning rate", ["train/lr"]), ("loss", ["train/loss"]),
                                                     ("grad norm", ["train/grad_norm"])])),
        _section("generations", "Generations", _generations(step, samples)),
    ]
    style = ("body{font-family:sans-serif;margin:2em;max-width:1120px}svg{margin:4px;border:1px solid #ddd}"
             ".t{font-size:13px;font-weight:bold}.l{font-size:10px}.ax{stroke:#888}.g{stroke:#eee}"
             "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 6px;"
             "vertical-align:top;text-align:left}pre{margin:0;white-space:pre-wrap;max-width:420px}")
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>top-rl report: {html.escape(str(run_dir))}'
            f'</title><style>{style}</style></head><body>\n<h1>top-rl report: {html.escape(str(run_dir))}</h1>\n'
            + "\n".join(p for p in parts if p) + "\n</body></html>\n")


def main(argv: list[str]) -> int:
    try:
        args = CLI.parse(argv)
        if args is None:  # --help
            return 0
        run_dir = Path(args.run_dir)
        page = render(run_dir, args.generations)
        out = Path(args.out) if args.out else run_dir / "report.html"
        write_file(out, lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))
    except UsageError as e:
        print(f"top-rl-report: {e}\n{CLI.usage()}", file=sys.stderr)
        return 2
    except (ReportError, OSError) as e:
        print(f"top-rl-report: {e}", file=sys.stderr)
        return 2
    print(f"[top-rl] wrote {out}")
    return 0
