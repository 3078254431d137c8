"""top-rl-report (top_rl/tools/report.py) renders a real small run (the default tiny job with eval and samples on)
into one self-contained HTML page: every section, inline SVG charts, generations from samples/, nothing fetched."""

import gzip
import html
import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from top_rl.cli import report_main

RUN = ["rollout.prompts_per_step=4", "rollout.n_samples=4", "cluster.torch_threads=1", "steps=3", "eval.every=1",
       "eval.n_samples=2", "eval.max_prompts=4", "rollout.save_samples_every=1", "rollout.save_samples_rows=8"]
VOID = {"meta", "br", "line", "circle", "polyline", "img", "hr", "input", "link"}


class _Tags(HTMLParser):
    """Opened and closed tags must nest; collect what the page would load from elsewhere."""

    def __init__(self):
        super().__init__()
        self.stack, self.tags, self.external = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.external += [v for k, v in attrs if k in ("src", "href") and v]
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        assert self.stack and self.stack[-1] == tag, (self.stack[-3:], tag)
        self.stack.pop()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("run")
    env = {**os.environ, "WANDB_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-m", "top_rl.cli", f"run_dir={d}", *RUN], capture_output=True, text=True,
                         timeout=400, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return d


@pytest.mark.slow
def test_report_renders_a_real_run(run_dir, capsys):
    assert report_main([f"run_dir={run_dir}", "generations=5"]) == 0
    page = (run_dir / "report.html").read_text()
    parser = _Tags()
    parser.feed(page)
    parser.close()
    assert parser.stack == []  # every tag closed where it opened
    assert parser.external == [] and "<script" not in page  # nothing loaded from elsewhere: self-contained
    ids = [line.split('"')[1] for line in page.splitlines() if line.startswith("<section id=")]
    assert ids == ["summary", "reward", "eval", "parity", "time", "lengths", "train", "generations"]
    assert page.count("<svg") >= 10 and "<polyline" in page
    for title in ("reward (mean, min, max)", "eval accuracy and pass@k", "train vs rollout log-prob abs_diff",
                  "ESS ratio", "seconds per step", "truncated fraction"):
        assert f"<title>{title}</title>" in page, title
    assert "perf/rollout_time" in page and "share of step" in page  # where a step's time goes
    with gzip.open(run_dir / "samples" / "step_000003.jsonl.gz", "rt") as f:
        first = [json.loads(line) for line in f][:5]
    assert "Step 3, its first 5 samples" in page
    for s in first:  # the generations, escaped as text
        assert f"<pre>{html.escape(s['prompt'])}</pre>" in page and f"<pre>{html.escape(s['response'])}</pre>" in page
    assert "<th>max abs_diff over the run</th><td>0.0</td>" in page  # the gated run's parity, in the summary


def test_report_refuses_a_directory_without_metrics(tmp_path, capsys):
    assert report_main([f"run_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"top-rl-report: {tmp_path / 'metrics.jsonl'} does not exist")
    assert report_main([]) == 2 and "run_dir= is required" in capsys.readouterr().err
    assert not (tmp_path / "report.html").exists()


def test_chart_legend_and_labels_stay_off_the_plot():
    """A screenshot of the first report showed the legend written over the lines (inside the plot, top right) and a
    small lr's y label ("0.0003806") cut at the page's left edge. The legend now has rows of its own above the plot,
    wrapped inside the chart, and the left margin holds a 9-character label."""
    import re

    from top_rl.tools import report

    names = {f"series_with_a_long_name_{i}": [(1, 0.0003806 * i), (10, 0.01)] for i in range(6)}
    svg = report.chart("t", names)
    axis = r'<line x1="%d" y1="([\d.]+)" x2="%d" y2="[\d.]+" class="ax"/>' % ((report.LEFT,) * 2)
    (plot_top,) = re.findall(axis, svg)  # the y axis: from the plot's top down
    legend = re.findall(r'<text x="([\d.]+)" y="([\d.]+)" class="l" fill="#[0-9a-f]+">([^<]+)</text>', svg)
    assert [n for _, _, n in legend] == list(names)
    for x, y, name in legend:
        assert float(y) < float(plot_top) and float(x) + 6 * len(name) <= report.W  # above the plot, inside the chart
    assert len({y for _, y, _ in legend}) > 1  # six long names wrap onto more rows
    labels = re.findall(r'<text x="([\d.]+)" y="[\d.]+" text-anchor="end" class="l">([^<]+)</text>', svg)
    assert "0" in [t for _, t in labels] and all(float(x) - 6 * len(t) >= 0 for x, t in labels)
    assert report.LEFT - 4 - 6 * len("0.0003806") >= 0  # about 6 px a character at font-size 10
