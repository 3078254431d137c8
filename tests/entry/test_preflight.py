"""Issue 14: every refusal a config or input can cause comes before Ray, wandb or any file write, and a
refused run leaves no run_dir behind. In-process: Ray's cluster and the tracker are replaced by stand-ins
that fail the test if the run ever gets that far."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from top_rl import cli, kernels, loop, preflight
from top_rl.cli import compose
from top_rl.tasks import ArithTask

SMALL = ["rollout.prompts_per_step=2", "rollout.n_samples=4", "rollout.max_new_tokens=3", "cluster.torch_threads=1"]


@pytest.fixture()
def nothing_starts(monkeypatch):
    def started(what):
        def fail(*a, **k):
            raise AssertionError(f"{what} started: the refusal came too late")
        return fail

    monkeypatch.setattr(loop, "Cluster", started("Ray (the cluster)"))
    monkeypatch.setattr(loop, "Tracker", started("wandb (the tracker)"))
    before = kernels.current_plan()
    yield
    kernels.install(before)  # the run installed its own plan


def _refused(run_dir: Path, *overrides: str) -> str:
    """The refusal's message; compose may refuse first (the CLI's path), else the run itself must."""
    try:
        cfg = compose([f"run_dir={run_dir}", *SMALL, *overrides])
    except preflight.REFUSALS as e:
        return str(e)
    with pytest.raises(preflight.REFUSALS) as e:
        cli.run(cfg)
    return str(e.value)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    ArithTask().save_tokenizer(str(d / "tok"))
    row = lambda q: json.dumps({"question": q, "answer": "so\n#### 4"}, ensure_ascii=False)  # noqa: E731
    (d / "empty.jsonl").write_text("")
    (d / "all_bad.jsonl").write_text("{oops\n\n")
    (d / "latin1.jsonl").write_bytes((row("What is 2+2?") + "\n" + row("Was ist 2+2? Gr\xfc\xdfe")).encode("latin-1"))
    long_q = "What is " + "1+" * 40 + "1?"
    rows = [row("What is 2+2?"), row("What is 1+3?"), row(long_q), row("What is 0+4?")]
    (d / "long.jsonl").write_text("\n".join(rows) + "\n")
    (d / "adir.jsonl").mkdir()
    return d


def _gsm(data: Path, name: str) -> list[str]:
    return ["task=gsm8k", f"task.path={data / name}", f"task.tokenizer={data / 'tok'}"]


@pytest.mark.parametrize("overrides, message", [
    (["trainer.lr=-1"], "trainer.lr=-1.0 must be > 0"),
    (["trainer.lr=0"], "trainer.lr=0.0 must be > 0"),
    (["trainer.eps=nan"], "trainer.eps=nan must be a finite number"),
    (["rollout.temperature=nan"], "rollout.temperature=nan must be a finite number"),
    (["rollout.temperature=inf"], "rollout.temperature=inf must be a finite number"),
    (["algo.loss.clip_eps_high=-inf"], "algo.loss.clip_eps_high=-inf must be a finite number"),
    (["rollout.n_samples=1"], "rollout.n_samples=1 must be >= 2 for GRPO"),
    (["rollout=sglang", "rollout.sglang.port=60000"], "port=60000: SGLang 0.5.11 also opens port + 10000 for gRPC"),
    (["trainer.micro_batch_size=-1"], "trainer.micro_batch_size=-1 must be >= 1, or null"),  # trained on nothing
    # Issue 24: layouts Megatron would refuse on every rank after Ray started (the tiny model: 4 heads, 2 KV heads,
    # head_dim 16, intermediate 128, 2 layers; the reference kernels' k_chunk is 64).
    (["trainer.tp=3", "cluster.num_cpus=4"], "trainer.tp=3 does not split this model: num_attention_heads (4) and "
     "num_key_value_heads (2) and intermediate_size (128) must be multiples of trainer.tp; valid trainer.tp: 1"),
    (["trainer.tp=8"], "trainer.tp=8 does not split this model: num_attention_heads (4) and num_key_value_heads (2) "
     "must be multiples of trainer.tp; valid trainer.tp: 1"),
    (["trainer.tp=2", "cluster.num_cpus=4"], "trainer.tp=2 does not split this model: with top.kernels=reference "
     "each rank's share of a row-parallel GEMM's K (num_attention_heads x head_dim / tp = 32) must be a multiple of "
     "the contract's k_chunk (64); valid trainer.tp: 1"),
    (["trainer.pp=3", "cluster.num_cpus=4"], "trainer.pp=3 does not split this model: num_hidden_layers (2) must be "
     "a multiple of trainer.pp; valid trainer.pp: 1, 2"),
    (["trainer.cp=4", "cluster.num_cpus=8"], "trainer.cp=4 does not split this model at trainer.tp=1: each TP rank's "
     "query heads (4) and KV heads (2) must be multiples of trainer.cp (Ulysses); valid trainer.cp: 1, 2"),
    # the vocabulary (the arith tokenizer's 18) is known once the task loads; still before Ray
    (["trainer.tp=4", "cluster.num_cpus=8", "top.enabled=false", "model.num_attention_heads=8",
      "model.num_key_value_heads=4"], "trainer.tp=4 does not split this model: vocab_size (18) must be a multiple of "
     "trainer.tp; valid trainer.tp: 1, 2"),
    # a placement this machine cannot hold suggests only layouts the model allows
    (["trainer.dp=64"], "Lower rollout.num_engines / trainer.{dp,tp,pp,cp} (this model allows trainer.tp 1 and "
     "trainer.pp 1, 2)"),
    # Issue 30: sizes no model or host can hold (they passed, and failed in the actors or grew without end)
    (["model.hidden_size=-64"], "invalid config: model.hidden_size=-64 must be a positive integer"),
    (["model.num_hidden_layers=0"], "model.num_hidden_layers=0 must be a positive integer"),
    (["model.num_key_value_heads=3"], "model.num_attention_heads=4 is not a multiple of model.num_key_value_heads=3"),
    (["model.head_dim=15"], "model.head_dim=15 must be even for NeoX RoPE"),
    (["model.rope_theta=0"], "model.rope_theta=0.0 must be > 0"),
    (["model.init_std=-0.02"], "model.init_std=-0.02 must be >= 0"),
    (["rollout.prompts_per_step=1000000000"], "of memory cannot hold the run: it needs at least "),
    (["rollout.prompts_per_step=1000000000"], "for a step's batch on the driver (rollout.prompts_per_step=1000000000 "
     "x rollout.n_samples=4 samples x (>= 1 prompt token x 16 B + rollout.max_new_tokens=3 x 96 B)) + "),
    # Issue 54: the native CPU engine's one call holds every sample's KV cache too
    (["rollout.prompts_per_step=1000000000"], "for 1 CPU engine(s)' generate call(s) (4,000,000,000 rows a call x "
     "67,584 B: (>= 1 prompt token + rollout.max_new_tokens=3) positions x 512 B of KV cache + 65,536 B for the "
     "reference decode attention's fp32 key blocks (4 heads x attn_kv_block=64 x head_dim=16, and the cache in fp32)) = "),
    (["rollout.prompts_per_step=1000000000"], ". Lower rollout.prompts_per_step (over "),
    (["model.hidden_size=100000", "model.intermediate_size=100000"], "parameters x (1 engine(s) x 4 B + 1 trainer "
     "replica(s) x 16 B)) = "),
    (["model.hidden_size=100000", "model.intermediate_size=100000"], "; or a smaller model (model.*), or actors on GPUs"),
    # Issue 54 item 8: these passed dry_run=true and the checks, then failed after Ray started
    (["cluster.torch_threads=-1"], "cluster.torch_threads=-1 must be >= 1, or 0 (the machine's cores)"),
    (["trainer.seed=-1"], "trainer.seed=-1 must be between 0 and 4294967295 (numpy's seed range"),
    ([f"trainer.seed={2 ** 70}"], f"trainer.seed={2 ** 70} must be between 0 and 4294967295"),
    (["seed=-1"], "seed=-1 must be between 0 and 4294967295"),
])
def test_config_refusals_come_before_anything_starts(tmp_path, nothing_starts, overrides, message):
    run_dir = tmp_path / "run"
    assert message in _refused(run_dir, *overrides)
    assert not run_dir.exists()


def test_a_config_changed_after_compose_is_checked_again(tmp_path, nothing_starts):
    cfg = compose([f"run_dir={tmp_path / 'run'}", *SMALL])
    cfg.rollout.temperature = float("nan")
    with pytest.raises(preflight.REFUSALS, match="rollout.temperature=nan must be a finite number"):
        cli.run(cfg)
    assert not (tmp_path / "run").exists()


def test_dataset_refusals_name_the_file_and_line(tmp_path, nothing_starts, data):
    run_dir = tmp_path / "run"
    assert f"task 'gsm8k': {data / 'empty.jsonl'} holds no usable rows: nothing to train on" in \
        _refused(run_dir, *_gsm(data, "empty.jsonl"))
    assert "holds no usable rows (2 bad rows skipped under task.on_bad_row=skip)" in \
        _refused(run_dir, *_gsm(data, "all_bad.jsonl"), "task.on_bad_row=skip")
    assert f"{data / 'latin1.jsonl'}:2: not UTF-8 text (byte b'\\xfc' at column " in \
        _refused(run_dir, *_gsm(data, "latin1.jsonl"))
    assert f"task 'gsm8k': task.path={data / 'adir.jsonl'} is a directory, not a regular file: nothing was read " \
        "from it; point task.path at a data file" in _refused(run_dir, *_gsm(data, "adir.jsonl"))
    n = len("Question: What is " + "1+" * 40 + "1?\nAnswer:")
    assert f"prompt 2 of task 'gsm8k' has {n} tokens; the model's context leaves 61 for a prompt" in \
        _refused(run_dir, *_gsm(data, "long.jsonl"), "model.max_position_embeddings=64")
    assert not run_dir.exists()


def test_data_that_is_no_regular_file_is_refused_unread(tmp_path, nothing_starts, data):
    """Issue 30: task.path=/dev/zero hung the checks (a line that never ends), a FIFO would wait for a writer."""
    os.mkfifo(tmp_path / "fifo")
    for path, kind in (("/dev/zero", "a character device"), (tmp_path / "fifo", "a FIFO")):
        for task in ("gsm8k", "dapo"):
            assert f"task.path={path} is {kind}, not a regular file: nothing was read from it" in \
                _refused(tmp_path / "run", f"task={task}", f"task.path={path}", f"task.tokenizer={data / 'tok'}")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides", [["cluster.torch_threads=-1"], ["trainer.seed=-1"], [f"trainer.seed={2 ** 70}"]])
def test_a_dry_run_refuses_what_the_actors_would(tmp_path, overrides):
    """Issue 54 item 8: dry_run=true planned these; the run then failed in every actor."""
    with pytest.raises(preflight.REFUSALS, match=re.escape(overrides[0].split("=")[0] + "=")):
        preflight.check(compose([f"run_dir={tmp_path / 'run'}", *SMALL, "dry_run=true", *overrides]),
                        preflight.CONFIG_CHECKS)


def test_a_model_safetensors_of_zeros_and_an_unreadable_task_path_are_named(tmp_path, nothing_starts, data):
    """Issue 54 item 8: a model.safetensors of 2 GB of zeros (a failed download) passed the checks and failed in each
    actor; task.path=/proc/self/mem (EIO on read) was refused without naming the file."""
    from top_rl.model import save_model

    from tests.helpers import tiny_model

    model = tmp_path / "model"
    save_model(tiny_model(vocab_size=32), model)
    with open(model / "model.safetensors", "r+b") as f:  # sparse: 2 GB of zeros that take no disk
        f.truncate(0)
        f.truncate(2 << 30)
    assert _refused(tmp_path / "run", f"model.path={model}") == (
        f"{model / 'model.safetensors'} is not a safetensors file: its header length is 0 bytes in a {2 << 30}-byte "
        "file; download it again, or point model.path at a complete Hugging Face checkpoint")
    assert _refused(tmp_path / "run", *_gsm(data, "x")[:1], "task.path=/proc/self/mem",
                    f"task.tokenizer={data / 'tok'}") == (
        "task 'gsm8k': reading task.path=/proc/self/mem failed (Input/output error): point task.path at a readable "
        "data file")
    assert not (tmp_path / "run").exists()


def test_a_run_dir_that_cannot_be_created_is_refused(tmp_path, nothing_starts):
    """Issue 30: run_dir under a regular file passed the checks and failed in mkdir (NotADirectoryError); an empty
    run_dir (an unset shell variable) ran in the working directory."""
    (tmp_path / "file").write_text("not a directory\n")
    assert _refused(tmp_path / "file" / "sub" / "run") == (
        f"run_dir={tmp_path / 'file' / 'sub' / 'run'} cannot be created: {tmp_path / 'file'} is a file, not a "
        "directory; pick another run_dir=")
    with pytest.raises(preflight.REFUSALS, match=re.escape("invalid config: run_dir='' is empty (an unset shell "
                                                           "variable?): the run would write into the current directory")):
        compose(["run_dir=", *SMALL])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@contextlib.contextmanager
def _unprivileged():
    """Root writes through any mode bits: drop to `nobody` for the check (os.access with effective ids)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


def test_read_only_run_dir_is_refused_before_anything_starts(nothing_starts):
    base = Path(tempfile.mkdtemp(prefix="top_rl_ro_"))  # /tmp: `nobody` can reach it (pytest's tmp is 0700)
    run_dir = base / "ro"
    run_dir.mkdir()
    base.chmod(0o755)
    run_dir.chmod(0o555)
    cfg = compose([f"run_dir={run_dir}", *SMALL])
    try:
        with _unprivileged(), pytest.raises(preflight.Refused) as e:
            cli.run(cfg)
        assert f"run_dir={run_dir} is not writable ({run_dir} refuses writes)" in str(e.value)
        assert list(run_dir.iterdir()) == []
    finally:
        run_dir.chmod(0o755)
        shutil.rmtree(base)


def _top_rl(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "top_rl.cli", f"run_dir={run_dir}", *SMALL, *overrides],
                          capture_output=True, text=True, timeout=120, env=env)


def test_cli_refusals_are_one_message_and_leave_no_run_dir(tmp_path):
    out = _top_rl(tmp_path / "a", "rollout.temperature=nan")
    assert out.returncode == 2 and "top-rl: invalid config: rollout.temperature=nan must be a finite number" \
        in out.stderr and "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1
    out = _top_rl(tmp_path / "b", "rollout=sglang", "rollout.sglang.port=60000")
    assert out.returncode == 1 and "top-rl: port=60000: SGLang" in out.stderr
    assert "Traceback" not in out.stderr and "Ray" not in out.stderr
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ issue 54: a step no engine call can hold
def test_a_step_whose_engine_call_cannot_fit_this_host_is_refused_with_its_numbers(tmp_path, nothing_starts,
                                                                                    monkeypatch):
    """rollout.n_samples=100000 (1.6 M samples in the native engine's one call) passed the batch bound alone (0.3 GiB
    of it) and ran for ten minutes without a sample; its KV cache alone is 2.3 GiB, its reference decode attention's
    key blocks ~100 GiB (a 2 GiB host refuses it either way)."""
    from top_rl.driver import host_memory

    monkeypatch.setattr(host_memory, "host_bytes", lambda: 2 << 30)
    message = _refused(tmp_path / "run", "rollout.prompts_per_step=16", "rollout.n_samples=100000",
                       "rollout.max_new_tokens=2")
    assert message.startswith("this host's 2.0 GiB of memory cannot hold the run: it needs at least "), message
    assert "99.9 GiB for 1 CPU engine(s)' generate call(s) (1,600,000 rows a call x 67,072 B: (>= 1 prompt token + " \
           "rollout.max_new_tokens=2) positions x 512 B of KV cache + 65,536 B for the reference decode attention's " \
           "fp32 key blocks" in message, message
    assert "cluster.rollout_chunk" in message and "rollout.n_samples" in message
    assert not (tmp_path / "run").exists()
    # waves of cluster.rollout_chunk rows per engine call hold only those: the same step then fits
    cfg = compose([f"run_dir={tmp_path / 'run'}", *SMALL, "rollout.prompts_per_step=16", "rollout.n_samples=100000",
                   "rollout.max_new_tokens=2", "cluster.rollout_chunk=4096"])
    preflight.host_memory(cfg, preflight.Ready())


def test_cli_refuses_a_step_no_engine_call_can_hold_in_one_line_before_ray(tmp_path):
    """The same in the shell, on this host: n_samples whose batch alone fits (the old bound let it start) and whose
    engine call's KV cache does not (max_new_tokens=1: no decode step, so the KV cache and the sampler's buffers)."""
    from top_rl.driver import host_memory

    per_batch, per_kv = host_memory.sample_bytes(1), (1 + 1) * 2 * 2 * 2 * 16 * 4  # tiny: 2 layers, 2 KV heads x 16
    n = int(host_memory.host_bytes() * 1.2) // (16 * (per_batch + per_kv)) + 1
    assert 16 * n * per_batch < host_memory.host_bytes() // 2
    out = _top_rl(tmp_path / "run", "rollout.prompts_per_step=16", f"rollout.n_samples={n}", "rollout.max_new_tokens=1")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith("top-rl: this host's ") and f"rollout.n_samples={n}" in lines[0]
    assert "for 1 CPU engine(s)' generate call(s)" in lines[0] and "B of KV cache" in lines[0]
    assert "Ray" not in out.stderr and list(tmp_path.iterdir()) == []


# The issue's command as a user types it, in a process whose host has this machine's 23.5 GiB (the first run that
# reported it) and whose Ray start is a tripwire: a refusal that came after Ray would leave its mark.
_ON_A_23_5_GIB_HOST = r"""
import sys
from pathlib import Path
import ray
from top_rl import cli
from top_rl.driver import host_memory

host_memory.host_bytes = lambda: int(23.5 * 2**30)
def started(*a, **k):
    Path("ray_started").write_text("ray.init was called")
    raise SystemExit("Ray started")
ray.init = started
sys.argv = ["top-rl", *sys.argv[1:]]
cli.main()
"""


def test_cli_refuses_the_issues_n_samples_100000_on_a_23_5_gib_host_before_ray(tmp_path):
    """Issue 54 item 3: `top-rl rollout.n_samples=100000 cluster.torch_threads=1 tracking.wandb_mode=offline` (the
    default tiny job: 16 prompts x 100000 samples = 1.6 M rows in the native engine's one call) passed the KV cache
    bound (2.3 GiB) on a 23.5 GiB host and never finished a step; the call needs ~74 KB a row on the reference kernels
    (~110 GiB). Now one line before Ray: the rows, the bytes a row, the host, and the keys that fix it."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-c", _ON_A_23_5_GIB_HOST, "rollout.n_samples=100000",
                          "cluster.torch_threads=1", "tracking.wandb_mode=offline"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr[-3000:]
    line = lines[0]
    assert line.startswith("top-rl: this host's 23.5 GiB of memory cannot hold the run: it needs at least "), line
    assert "(rollout.prompts_per_step=16 x rollout.n_samples=100000 samples x " in line, line
    assert "GiB for 1 CPU engine(s)' generate call(s) (1,600,000 rows a call x 67,072 B: (>= 1 prompt token + " \
           "rollout.max_new_tokens=2) positions x 512 B of KV cache + 65,536 B for the reference decode attention's " \
           "fp32 key blocks" in line, line
    for fix in ("Lower rollout.prompts_per_step", "rollout.n_samples or rollout.max_new_tokens", "cluster.rollout_chunk",
                "cluster.engine_gpus"):
        assert fix in line, line
    assert "Ray" not in out.stderr and list(tmp_path.iterdir()) == []  # no ray_started, no runs/default


# ------------------------------------------------------------------ issue 32: the test-only fault plan
def test_a_malformed_fault_spec_is_refused_before_anything_starts_naming_the_part(tmp_path, nothing_starts,
                                                                                   monkeypatch):
    monkeypatch.setenv("TOP_RL_FAULT", "kill_engine:1,kill_trainr:2")
    message = _refused(tmp_path / "run")
    assert message.startswith("TOP_RL_FAULT='kill_engine:1,kill_trainr:2': 'kill_trainr:2' names no fault point")
    monkeypatch.setenv("TOP_RL_FAULT", "kill_engine:soon")
    assert "'kill_engine:soon' is not kill_engine:N with N a whole number >= 1" in _refused(tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_cli_refuses_a_malformed_fault_spec_in_one_line_before_ray(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled", "TOP_RL_FAULT": "kill_after_step:three"}
    out = subprocess.run([sys.executable, "-m", "top_rl.cli", f"run_dir={tmp_path / 'run'}", *SMALL],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 1 and out.stderr.splitlines() == [
        "top-rl: TOP_RL_FAULT='kill_after_step:three': 'kill_after_step:three' is not kill_after_step:N with N a whole "
        "number >= 1 (the step, or the occurrence in its process)"], out.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ issue 24: SGLang extra_args before Ray
from tests import sglang_cpu

from top_rl import contract  # noqa: E402
from top_rl.rollout.sglang import launch as sglang_launch  # noqa: E402

_SGLANG = sglang_cpu.import_error()
SGLANG = ["rollout=sglang", "model.path=/models/Qwen3-0.6B", "top.attention_backend=fa3"]


def _extra(*args: str) -> str:
    return "rollout.sglang.extra_args=[" + ",".join(f"'{a}'" for a in args) + "]"


@pytest.mark.skipif(_SGLANG is not None, reason=_SGLANG or "")
@pytest.mark.parametrize("extra, message", [
    (["--enable-torch-compile"], "enable_torch_compile=True (--enable-torch-compile: the TOP contract needs it off, "
                                 "torch.compile changes the kernels the trainer reproduces, §1.2)"),
    (["--enable-fp32-lm"], "enable_fp32_lm_head=True (--enable-fp32-lm-head: the TOP contract needs it off"),  # a prefix
    (["--enable-torch-comp"], "ambiguous option: --enable-torch-comp could match"),
    (["--quantization", "fp8"], "quantization='fp8' (--quantization: the TOP contract needs it off"),
    (["--dtype", "float16"], "dtype='float16' (need 'bfloat16')"),
])
def test_contract_breaking_extra_args_are_refused_before_ray(tmp_path, nothing_starts, extra, message):
    """SGLang's own parser (the pinned release is importable here), in the start-up checks and in a dry run's."""
    run_dir = tmp_path / "run"
    refused = _refused(run_dir, *SGLANG, _extra(*extra))
    assert message in refused and "\n" not in refused and not run_dir.exists()
    with pytest.raises(preflight.REFUSALS, match="contradicts the TOP contract|parser rejects"):
        preflight.check(compose([f"run_dir={run_dir}", *SGLANG, _extra(*extra)]), preflight.CONFIG_CHECKS)
    preflight.check(compose([*SGLANG, _extra("--log-level", "warning", "--stream-interval", "2")]),
                    preflight.CONFIG_CHECKS)  # flags the contract leaves free pass


@pytest.mark.parametrize("extra, flag, why", [
    (["--enable-torch-compile"], "--enable-torch-compile", "the TOP contract needs it off, torch.compile changes"),
    (["--enable-torch-comp"], "--enable-torch-compile", "the TOP contract needs it off"),
    (["--speculative-algorithm", "EAGLE"], "--speculative-algorithm", "the TOP contract needs it off, speculative decoding"),
    (["--dtype=float16"], "--dtype", "the TOP contract pins --dtype bfloat16"),
    (["--dp-size", "2"], "--dp-size", "one engine is one server with one data- and pipeline-parallel rank"),
])
def test_without_the_pinned_sglang_the_contract_flags_are_refused_by_name(tmp_path, nothing_starts, monkeypatch,
                                                                         extra, flag, why):
    monkeypatch.setattr(sglang_launch, "pinned_parser_missing", lambda top: "SGLang is not installed here")
    refused = _refused(tmp_path / "run", *SGLANG, _extra(*extra))
    assert f"rollout.sglang.extra_args sets {extra[0]!r} ({flag}): {why}" in refused
    assert refused.endswith("(checked by name: SGLang is not installed here)") and "\n" not in refused
    preflight.check(compose([*SGLANG, _extra("--log-level", "warning")]), preflight.CONFIG_CHECKS)


def test_the_parser_is_used_only_at_the_contracts_pinned_release():
    installed = contract.fallback()  # the installed release's contract
    other = dataclasses.replace(installed, sglang_version="9.9.9")
    assert f"the contract {other.name!r} pins 9.9.9" in sglang_launch.pinned_parser_missing(other)
    if _SGLANG is None:
        assert sglang_launch.pinned_parser_missing(installed) is None
