"""docs/tasks.md's example, run as written: its data file and reward file (outside the package) written from the page's
blocks, its command run verbatim by bash (`top-rl` being this checkout's CLI), and the run it makes has parity on
every step with rewards the user's function gave."""

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "tasks.md"


def example() -> tuple[dict[str, str], str]:
    """The files ("`NAME`, ...:" then a fenced block) and the first bash block of the page's Example section."""
    section = DOC.read_text().split("## Example", 1)[1].split("\n## ", 1)[0]
    files = {m.group(1): m.group(2) for m in re.finditer(r"^`([^`]+)`[^\n]*:\n\n```\w+\n(.*?)```", section, re.M | re.S)}
    command = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return files, command


def test_the_page_has_the_example_and_it_is_short():
    files, command = example()
    assert set(files) == {"my_data.jsonl", "my_reward.py"} and command.startswith("top-rl task=custom")
    assert sum(len(t.splitlines()) for t in files.values()) + len(command.splitlines()) <= 20


@pytest.mark.slow
def test_docs_tasks_example_runs_as_written(tmp_path):
    files, command = example()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "top-rl"  # `top-rl` as the installed console script runs it, from this checkout
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m top_rl.cli \"$@\"\n")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled",
           "WANDB_SILENT": "true"}
    out = subprocess.run(["bash", "-e", "-c", command], cwd=tmp_path, capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / re.search(r"run_dir=(\S+)", command).group(1)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["train/train_rollout_logprob_abs_diff"] == 0.0 and r["train/ess_ratio"] == 1.0 for r in rows)
    assert all(0.0 <= r["rollout/reward_mean"] <= 1.0 for r in rows)
    state = json.loads(next((run_dir / "checkpoints").glob("step_*/state.json")).read_text())
    assert state["config"]["task"]["reward_fn"] == "my_reward.py:score"
