"""Start-up that speaks (top_rl/observe/startup.py): each run's logs in a directory of its own under run_dir/logs/,
and an actor's Python output copied into its file there while still reaching the console. The lines themselves and
the files of a real run are checked by the CPU end-to-end runs (tests/entry/test_loop_e2e.py, native engine;
tests/entry/test_loop_sglang_standin.py, an SGLang server's log) through tests/startup_lines.py."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from top_rl.observe.startup import StartupLog, run_logs_dir


def test_each_run_gets_its_own_absolute_log_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = run_logs_dir("runs/x", datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc))
    b = run_logs_dir("runs/x", datetime(2026, 1, 2, 3, 4, 6, tzinfo=timezone.utc))
    assert a.is_absolute() and a.parent == (tmp_path / "runs/x/logs").resolve() and a != b
    assert re.fullmatch(r"20260102T030405Z-\d+", a.name)
    assert not a.exists()  # planned, not created: nothing is written before the run lock is held


def test_an_actors_output_is_copied_to_its_file_and_still_reaches_the_console(tmp_path):
    log = tmp_path / "logs" / "trainer-rank0.log"
    code = ("import sys, warnings; from top_rl.observe.startup import tee_to; tee_to(sys.argv[1]); "
            "print('to stdout'); print('to stderr', file=sys.stderr); warnings.warn('a warning')")
    out = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "to stdout" in out.stdout and "to stderr" in out.stderr and "a warning" in out.stderr
    text = log.read_text()
    assert "to stdout" in text and "to stderr" in text and "a warning" in text


def test_startup_line_says_the_seconds_since_the_driver_began(capsys):
    StartupLog(t0=0.0).say("local Ray up")
    assert re.fullmatch(r"\[top-rl\] start-up \+\d+\.\ds: local Ray up\n", capsys.readouterr().out)
