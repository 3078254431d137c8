"""bench/rl_step_compare.py's bookkeeping on CPU, with a stand-in job (a small script, not top-rl): a job that runs
past --job-timeout is stopped and its rows kept (the H200 call of session 9 lost the TOP job's table to an uncaught
TimeoutExpired), the server's last log lines land in the job's log, and the side-by-side table needs both jobs."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("rl_step_compare", ROOT / "bench" / "rl_step_compare.py")
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)

STAND_IN = textwrap.dedent('''
    import json, sys, time
    from pathlib import Path
    args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
    run_dir, hang = Path(args["run_dir"]), args.get("top.enabled") == "false"
    run_dir.mkdir(parents=True)
    Path(args["rollout.sglang.log_path"]).write_text("server started\\nscheduler: CUDA out of memory at resume\\n")
    backend = "stock" if hang else "sglang"  # the trainer rank's report first, then the engine's
    (run_dir / "kernels.json").write_text(json.dumps([{"backend": backend, "paths": {"attention": "flash_varlen"},
                                                       "fallbacks": {}}, {"backend": "engine", "paths": {}}]))
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step in range(1, (1 if hang else int(args["steps"])) + 1):
            f.write(json.dumps({"step": step, "perf/step_time": 10.0 * step, "perf/rollout_time": 4.0,
                                "train/train_rollout_logprob_abs_diff": 0.0, "train/ess_ratio": 1.0}) + "\\n")
            f.flush()
    if hang:
        time.sleep(120)  # a job that does not end: stopped by --job-timeout
''')


def test_a_job_past_its_timeout_is_stopped_its_rows_kept_and_its_server_log_shown(tmp_path, capsys):
    script = tmp_path / "job.py"
    script.write_text(STAND_IN)
    out = tmp_path / "out"
    try:
        compare.main(["--out", str(out), "--run-root", str(tmp_path / "runs"), "--steps", "3", "--job-timeout", "5",
                      "--launcher", sys.executable, str(script)])
    except SystemExit as e:
        assert e.code == 1
    else:
        raise AssertionError("the stand-in TOP job ran 3 steps, the non-TOP one 1: a table was written anyway?")
    printed = capsys.readouterr().out
    assert "[compare] non-TOP: stopped at --job-timeout 5 s" in printed
    rows = [json.loads(x) for x in (out / "metrics_non-TOP.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]  # what the stopped job logged is kept
    assert "CUDA out of memory at resume" in (out / "compare_non-TOP.log").read_text()
    assert not (out / "rl_step_compare.md").exists()  # no side-by-side table without both jobs
    top = (out / "rl_step_compare_TOP.md").read_text()
    assert "TOP alone, 3 steps" in top and "| step | 25.00 |" in top  # median of steps 2 and 3 (20, 30)
    assert "TOP trainer kernels: backend sglang (attention flash_varlen); no fallback" in top
    assert json.loads((out / "kernels_non-TOP.json").read_text())[0]["backend"] == "stock"  # copied to --out
    assert "non-TOP trainer kernels: backend stock" in (out / "rl_step_compare_non-TOP.md").read_text()


def test_the_trainer_kernels_line_says_what_ran_and_what_fell_back(tmp_path):
    assert compare.trainer_kernels(tmp_path, "non-TOP") == "not recorded (no kernels.json)"
    (tmp_path / "kernels_non-TOP.json").write_text(json.dumps([
        {"backend": "stock", "paths": {"rms_norm": "torch", "attention": "flash_varlen"},
         "fallbacks": {"rms_norm": "RuntimeError: no PTX"}}]))
    assert compare.trainer_kernels(tmp_path, "non-TOP") == ("backend stock (attention flash_varlen, rms_norm torch); "
                                                            "fell back: rms_norm: RuntimeError: no PTX")
    rows = [{"perf/step_time": 1.0}] * 2
    text = compare.table({"TOP": rows, "non-TOP": rows}, skip=1, out=tmp_path)
    assert text.splitlines()[-1].startswith("non-TOP trainer kernels: backend stock (attention flash_varlen")


def test_the_side_by_side_table_divides_top_by_non_top_per_part():
    rows = lambda step_s: [{"perf/step_time": 99.0}] + [{"perf/step_time": step_s, "perf/trainer/old_logprobs_s": 1.0}  # noqa: E731
                                                          for _ in range(3)]
    text = compare.table({"TOP": rows(12.0), "non-TOP": rows(10.0)}, skip=1)
    step = next(line for line in text.splitlines() if "**step**" in line)
    assert step == "| **step** | 12.00 | 10.00 | 9.00 | 1.20 | 1.33 |"  # no-fwd: 10 less the 1 s old-log-prob pass
