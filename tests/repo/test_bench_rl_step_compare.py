"""bench/rl_step_compare.py on CPU: which server flags each side's config gives (composed and resolved by top_rl.cli
as a job does, on a stand-in Hopper GPU), the table from recorded per-part timings, and the compare end to end with a
stand-in job (a small script, not top-rl) and the real Megatron GPTModel worker on a tiny model: a job past
--job-timeout is stopped and its rows kept (the H200 call of session 9 lost the TOP job's table to an uncaught
TimeoutExpired), the server's last log lines land in the job's log, the side-by-side table needs both jobs, and jobs
run in separate calls into one --out make one table."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from pathlib import Path

import pytest

from top_rl import cli, contract
from top_rl.driver import backend_choice
from top_rl.driver.local_gpu import LocalGpu

ROOT = Path(__file__).resolve().parents[2]
compare = importlib.import_module("bench.rl_step_compare")
report = importlib.import_module("bench._compare_report")

H100 = LocalGpu("NVIDIA H100 80GB HBM3", (9, 0), 80 * 2**30)
INSTALLED = contract.fallback()  # what top.contract=installed resolves to here (0.5.11's, or 0.5.17's in CI's pass)


@pytest.fixture
def hopper(monkeypatch):
    """The driver sees an H100: `auto` resolves as on the GPU machine the compare runs on."""
    monkeypatch.setattr(backend_choice, "local_gpu", lambda: H100)


def _flags(argv: list[str]) -> list[str]:
    """The server's flags after the per-server ones (model, address, TP, attention, memory, scheduler sizes)."""
    i = argv.index("--enable-memory-saver")  # the last per-server flag of the compare's layout (gpu_handoff)
    return argv[i + 1:]


def test_the_top_side_is_the_shipped_default_and_its_server_gets_the_contract(hopper, tmp_path):
    shipped = cli.compose([*compare.JOB, f"run_dir={tmp_path}"])
    assert cli.compose([*compare.JOB, f"run_dir={tmp_path}", *compare.TOP.overrides()]).as_dict() == shipped.as_dict()
    plan = compare.server_plan(compare.TOP, [f"run_dir={tmp_path}"])
    proven = "fa3" in INSTALLED.decode_equals_extend  # 0.5.11's contract: fa3 + decode on Hopper
    assert plan["attention"]["backend"] == ("fa3" if proven else "triton")
    assert plan["attention"]["logprob_source"] == ("decode" if proven else "prefill")
    assert plan["argv"][plan["argv"].index("--attention-backend") + 1] == plan["attention"]["backend"]
    assert _flags(plan["argv"]) == list(INSTALLED.engine_flags)  # the contract's, verbatim: radix cache off
    assert plan["env"] == {**dict(INSTALLED.engine_env), "SGLANG_ENABLE_LOGITS_PROCESSER_CHUNK": "1"}  # + the recipe's
    assert plan["contract"] == INSTALLED.name


@pytest.mark.parametrize("attention", ["fa3", "triton"])
def test_the_non_top_server_is_sglangs_default_mode(hopper, tmp_path, attention):
    import dataclasses

    job = dataclasses.replace(compare.NON_TOP, attention_backend=attention)
    plan = compare.server_plan(job, [f"run_dir={tmp_path}"])
    argv = plan["argv"]
    assert argv[argv.index("--attention-backend") + 1] == attention  # named, not left to SGLang's own pick
    assert plan["attention"] == {"backend": attention, "logprob_source": "decode", "chosen_by": "the config"}
    # no determinism flag, radix cache on, CUDA graphs on (captured up to the whole batch, as on the TOP side); only
    # what every server of the engine needs: token ids in and out, the checkpoint's dtypes
    assert [f for f in _flags(argv) if f != "--disable-piecewise-cuda-graph"] == [
        "--dtype", "bfloat16", "--kv-cache-dtype", "auto", "--skip-tokenizer-init"]
    assert argv[argv.index("--cuda-graph-max-bs" if "--cuda-graph-max-bs" in argv else
                           INSTALLED.release.cuda_graph_max_bs_flag) + 1] == "512"
    # none of the contract's env (deterministic inference, the batch-invariant GEMM): the recipe's own only
    assert plan["env"] == {"SGLANG_ENABLE_LOGITS_PROCESSER_CHUNK": "1"}
    # 0.5.11's default mode crashes capturing the piecewise prefill graphs on fa3 (_compare_sides.py): off there only
    assert ("--disable-piecewise-cuda-graph" in argv) == (attention == "fa3")
    assert "algo.old_logprobs=recompute" in job.overrides() and "top.enabled=false" in job.overrides()


def test_a_refused_config_is_recorded_not_raised(tmp_path):
    plan = compare.server_plan(compare.TOP, [f"run_dir={tmp_path}", "rollout.n_samples=1"])
    assert plan["error"].startswith("ConfigError") and "n_samples" in plan["error"]


def _row(step_s, rollout, fwd_bwd, gate, optimizer, push, old=None, **more):
    row = {"perf/step_time": step_s, "perf/rollout_time": rollout, "perf/trainer/forward_backward_s": fwd_bwd,
           "perf/trainer/gate_s": gate, "perf/trainer/optimizer_s": optimizer, "perf/weight_push_time": push, **more}
    if old is not None:
        row["perf/trainer/old_logprobs_s"] = old
    return row


def test_the_table_divides_top_by_each_column_per_part_and_for_the_step(tmp_path):
    """Every column by hand: TOP 10 + 0 + 7 + 1 + 2 (other) = 20; the non-TOP job 6 + 3 + 8 + 1 + 2 = 20; without its
    forward 17; with the Megatron GPT trainer's 2 s forward and 5 s step 16, and 14 without the forward."""
    warm = _row(99.0, 50.0, 9.0, 1.0, 1.0, 1.0, old=9.0)
    top = [warm] + [_row(20.0, 10.0, 6.0, 0.5, 0.5, 1.0, **{"perf/rollout_tokens_per_s": 20_000.0,
                                                             "perf/trained_tokens_per_s": 40_000.0})] * 3
    non_top = [warm] + [_row(20.0, 6.0, 7.0, 0.4, 0.6, 1.0, old=3.0, **{"perf/rollout_tokens_per_s": 30_000.0,
                                                                       "perf/trained_tokens_per_s": 35_000.0})] * 3
    megatron = {"status": "ok", "shape": [512, 130, 1024], "model": "qwen3-0.6b", "attention": "flash",
                "micro_batch_tokens": 16384, "recompute": "on", "step_s": 5.0, "old_logprob_s": 2.0,
                "tokens_per_s": 118_000.0}
    text = compare.table({"TOP": top, "non-TOP": non_top}, skip=1, out=tmp_path, megatron=megatron)
    lines = text.splitlines()
    assert lines[2] == ("| part | TOP | non-TOP, Qwen3 stock, + old-lp fwd | non-TOP, Qwen3 stock | non-TOP, Megatron "
                        "GPT, + old-lp fwd | non-TOP, Megatron GPT |")
    steps = [line for line in lines if line.startswith("| **step**")]
    assert steps == ["| **step** | **20.00** | **20.00** | **17.00** | **16.00** | **14.00** |",
                     "| **step** | **1.00** | **1.18** | **1.25** | **1.43** |"]
    assert "| train fwd+bwd+optim | 7.00 | 8.00 | 8.00 | 5.00 | 5.00 |" in lines
    assert "| old-log-prob forward | 0.00 | 3.00 | 0.00 | 2.00 | 0.00 |" in lines
    assert "| old-log-prob forward | - | - | - | - |" in lines  # TOP has none: no ratio
    assert "| rollout (generate) | 1.67 | 1.67 | 1.67 | 1.67 |" in lines
    assert "generated tok/s (median): TOP 20,000, non-TOP 30,000" in lines
    assert "trained tok/s, the train call (median): TOP 40,000, non-TOP 35,000" in lines
    assert any(line.startswith("card: ") and "releases: torch " in line for line in lines)
    assert "on the non-TOP job's batch shape, 512 samples x (130 prompt + 1024 response) tokens" in text


def test_without_a_megatron_gpt_result_its_columns_are_left_out_and_the_table_says_why():
    rows = [_row(10.0, 5.0, 3.0, 0.0, 0.0, 1.0, old=1.0)] * 2
    text = compare.table({"TOP": rows, "non-TOP": rows}, skip=1,
                         megatron={"status": "stopped at --stock-timeout 240 s", "shape": [4, 8, 24], "model": "tiny",
                                   "attention": "math", "micro_batch_tokens": 256, "recompute": "on"})
    assert "Megatron GPT |" not in text and "non-TOP, Qwen3 stock |" in text
    assert text.splitlines()[-1].endswith("stopped at --stock-timeout 240 s (its columns are left out)")


def test_the_megatron_gpt_batch_is_the_jobs_step():
    """samples = generated tokens / mean response; prompt = trained tokens / samples - response (medians)."""
    row = {"rollout/response_len_mean": 1000.0, "perf/rollout_tokens_per_s": 25_600.0, "perf/rollout_time": 20.0,
           "train/tokens": 512 * 1130}
    assert compare.batch_shape([{}, row, row], skip=1) == (512, 130, 1000)


STAND_IN = textwrap.dedent('''
    import json, sys, time
    from pathlib import Path
    args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
    run_dir, hang = Path(args["run_dir"]), args.get("top.enabled") == "false" and "hang" in Path(sys.argv[0]).name
    run_dir.mkdir(parents=True)
    Path(args["rollout.sglang.log_path"]).write_text("server started\\nscheduler: CUDA out of memory at resume\\n")
    backend = "stock" if args.get("top.enabled") == "false" else "sglang"  # the trainer rank's, then the engine's
    (run_dir / "kernels.json").write_text(json.dumps([{"backend": backend, "paths": {"attention": "flash_varlen"},
                                                       "fallbacks": {}}, {"backend": "engine", "paths": {}}]))
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step in range(1, (1 if hang else int(args["steps"])) + 1):
            # 4 samples of 8 prompt and 24 response tokens a step: the Megatron GPT worker's batch
            f.write(json.dumps({"step": step, "perf/step_time": 10.0 * step, "perf/rollout_time": 4.0,
                                "perf/rollout_tokens_per_s": 24.0, "rollout/response_len_mean": 24.0,
                                "train/tokens": 128, "perf/trainer/old_logprobs_s": 0.5 * (args.get(
                                    "algo.old_logprobs") == "recompute"),
                                "train/train_rollout_logprob_abs_diff": 0.0, "train/ess_ratio": 1.0}) + "\\n")
            f.flush()
    if hang:
        time.sleep(120)  # a job that does not end: stopped by --job-timeout
''')


def _main(tmp_path, script, *more):
    return compare.main(["--out", str(tmp_path / "out"), "--run-root", str(tmp_path / "runs"), "--steps", "3",
                         "--launcher", sys.executable, str(script), *more])


def test_a_job_past_its_timeout_is_stopped_its_rows_kept_and_its_server_log_shown(tmp_path, capsys):
    script = tmp_path / "hang_job.py"
    script.write_text(STAND_IN)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:  # the TOP job ran 3 steps, the non-TOP one 1: no table
        _main(tmp_path, script, "--job-timeout", "5", "--only", "TOP", "--only", "non-TOP")
    assert e.value.code == 1
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
    assert report.trainer_kernels(tmp_path, "non-TOP") == "not recorded (no kernels.json)"
    (tmp_path / "kernels_non-TOP.json").write_text(json.dumps([
        {"backend": "stock", "paths": {"rms_norm": "torch", "attention": "flash_varlen"},
         "fallbacks": {"rms_norm": "RuntimeError: no PTX"}}]))
    assert report.trainer_kernels(tmp_path, "non-TOP") == ("backend stock (attention flash_varlen, rms_norm torch); "
                                                            "fell back: rms_norm: RuntimeError: no PTX")


def test_the_compare_in_two_calls_with_the_megatron_gpt_worker_on_cpu(tmp_path, capsys):
    """Call 1 runs the TOP job, call 2 the non-TOP job and the real Megatron GPTModel worker (a tiny model on CPU) on
    that job's batch: the second call prints the whole table from both calls' files; --report prints it again."""
    script = tmp_path / "job.py"
    script.write_text(STAND_IN)
    out = tmp_path / "out"
    with pytest.raises(SystemExit):
        _main(tmp_path, script, "--only", "TOP")
    stock = ["--stock-model", "tiny", "--stock-device", "cpu", "--stock-attention", "math", "--stock-iters", "1",
             "--stock-timeout", "280"]
    _main(tmp_path, script, "--only", "non-TOP", "--only", "megatron_gpt", *stock)
    megatron = json.loads((out / "megatron_gpt.json").read_text())
    assert megatron["status"] == "ok", (out / "megatron_gpt.log").read_text()[-2000:]
    assert megatron["shape"] == [4, 8, 24] and megatron["step_s"] > 0 and megatron["old_logprob_s"] > 0
    text = (out / "rl_step_compare.md").read_text()
    assert "| non-TOP, Megatron GPT |" in text.splitlines()[2] + " |"
    step = next(line for line in text.splitlines() if line.startswith("| **step**"))
    cells = [float(c.strip("* ")) for c in step.split("|")[2:-1]]
    # TOP and the non-TOP job: 25 s (steps 2 and 3); without its 0.5 s forward 24.5; the Megatron columns: the
    # job's step less its 0.5 s forward, plus the worker's forward (+fwd) and step in place of the job's 0 s trainer
    assert cells[:3] == [25.0, 25.0, 24.5]
    assert cells[3] == pytest.approx(24.5 + megatron["old_logprob_s"] + megatron["step_s"], abs=0.006)
    assert cells[4] == pytest.approx(24.5 + megatron["step_s"], abs=0.006)
    assert "non-TOP server: --tp-size 1 --attention-backend fa3" in text
    assert "--disable-radix-cache" in next(line for line in text.splitlines() if line.startswith("TOP server: "))
    capsys.readouterr()
    _main(tmp_path, script, "--report")
    assert capsys.readouterr().out.strip() == text.strip()
