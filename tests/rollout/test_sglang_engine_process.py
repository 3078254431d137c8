"""The engine's process handling, with the STAND-IN server (tests/doubles/sglang_standin.py, not SGLang) as the
child process: the engine builds the real `python -m sglang.launch_server ...` command, and a wrapper given as
`python` runs the stand-in with those flags. Covered: the launch (version check through that interpreter,
SGLang-parser validation, /health wait, /server_info check), a clear startup error with the log tail, the
restart of a dead server with a retry, and the distributed weight sync over a real process group (gloo on CPU
instead of NCCL, joined with the pinned SGLang's own helper on both ends).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from tests import sglang_cpu
from tests.helpers import in_thread, tiny_model

from top_rl.model import hf_state_dict, save_model  # noqa: E402
from top_rl.weights import sglang_distributed  # noqa: E402
from top_rl.engine.interface import SamplingParams  # noqa: E402
from top_rl.rollout.native.engine import NativeEngine  # noqa: E402
from top_rl import contract  # noqa: E402
from top_rl.rollout.sglang.engine import SglangEngine, SglangEngineRestarted  # noqa: E402
from top_rl.rollout.sglang.client import SglangUnavailable  # noqa: E402
from top_rl.rollout.sglang.config import SglangEngineConfig  # noqa: E402
from top_rl.rollout.sglang.server import SglangStartupError  # noqa: E402

V1 = sglang_cpu.CONTRACT  # the contract these engines run under (the installed release's)

_ERR = sglang_cpu.import_error()
pytestmark = pytest.mark.skipif(_ERR is not None, reason=_ERR or "")
ROOT = Path(__file__).resolve().parents[2]
PROMPTS, SEEDS = [[5, 6, 7], [9, 8]], [1, 2]
# the repo, then this process's PYTHONPATH (CI's 0.5.17 pass puts that release's --target dir there)
_PYTHONPATH = os.pathsep.join([str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
PARAMS = SamplingParams(max_new_tokens=4, temperature=0.9)


def _free_port() -> int:
    from top_rl.rollout.sglang.config import free_port

    return free_port()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("proc")
    save_model(tiny_model(), root / "ckpt")
    wrapper = root / "python"  # runs the stand-in for `-m sglang.launch_server`, the real python otherwise
    wrapper.write_text(f'#!/bin/sh\nif [ "$1" = "-m" ] && [ "$2" = "sglang.launch_server" ]; then\n  shift 2\n'
                       f'  exec env PYTHONPATH={_PYTHONPATH} {sys.executable} -m tests.doubles.sglang_standin "$@"\nfi\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return root, wrapper


def _cfg(setup, tmp_path, **kw) -> SglangEngineConfig:
    root, wrapper = setup
    base = dict(model_path=str(root / "ckpt"), attention_backend="fa3", logprob_source="prefill", top=True,
                port=_free_port(), python=str(wrapper), weights_dir=str(tmp_path / "w"),
                log_path=str(tmp_path / "server.log"), startup_timeout_s=120, retry_backoff_s=0.05, max_retries=1,
                env={"PYTHONPATH": _PYTHONPATH})
    return SglangEngineConfig(**{**base, **kw})


def _kill(eng: SglangEngine) -> None:
    os.killpg(eng.server.proc.pid, signal.SIGKILL)
    eng.server.proc.wait()


@pytest.mark.slow  # over 30 s (--durations, issue 25)
def test_launch_restart_and_retry_with_disk_weights(setup, tmp_path):
    eng = SglangEngine(_cfg(setup, tmp_path), "fa3", top=V1)
    try:
        info = eng.start()
        assert info["stand_in"] is True and info["version"] == sglang_cpu.SGLANG_VERSION
        other = tiny_model(seed=5)
        eng.load_named_tensors(hf_state_dict(other))
        before = eng.generate(PROMPTS, SEEDS, PARAMS)
        assert [s.logprobs for s in before] == [s.logprobs for s in NativeEngine(other).generate(PROMPTS, SEEDS, PARAMS)]
        _kill(eng)  # the server dies between two requests
        assert not eng.health()
        after = eng.generate(PROMPTS, SEEDS, PARAMS)  # restart, reload the last disk version, retry once
        assert eng.server.starts == 2 and after[0].meta["weight_version"] == "1"
        assert [s.logprobs for s in after] == [s.logprobs for s in before]
        log = Path(eng.server.log_path).read_text()
        assert "top-rl start #2" in log and "--enable-deterministic-inference" in log
    finally:
        eng.shutdown()
    assert eng.server.proc is None


def test_a_dead_server_is_named_with_its_exit_code_and_log_tail(setup, tmp_path):
    """A server that dies where no restart may help (here: before the memory handoff's release) is reported with its
    exit code and the last lines of its log, where the cause is (an out-of-memory at resume, say)."""
    eng = SglangEngine(_cfg(setup, tmp_path, restart_on_failure=False), "fa3", top=V1)
    try:
        eng.start()
        _kill(eng)
        with pytest.raises(SglangUnavailable, match=r"(?s)POST /release_memory_occupation.*exited with code -9; "
                                                    r"last log lines .*top-rl start #1"):
            eng.release_memory()
        assert not eng.weights.released  # nothing recorded as released
    finally:
        eng.shutdown()


def _fake_server(tmp_path, launch_body: str) -> Path:
    """An interpreter whose `-m sglang.launch_server` runs `launch_body` (no server), real python otherwise."""
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nif [ "$1" = "-m" ]; then\n{launch_body}\nfi\nexec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    return fake


def test_startup_error_carries_the_log_tail(setup, tmp_path):
    fake = _fake_server(tmp_path, 'echo "Load weight begin."\necho "torch.OutOfMemoryError: CUDA out of memory" >&2\nexit 1')
    eng = SglangEngine(_cfg(setup, tmp_path, python=str(fake)), "fa3", top=V1)
    with pytest.raises(SglangStartupError, match=r"(?s)exited with code 1 during startup; last log lines .*"
                                                 r"--attention-backend fa3.*Load weight begin.*CUDA out of memory"):
        eng.start()


def test_startup_timeout(setup, tmp_path):
    eng = SglangEngine(_cfg(setup, tmp_path, python=str(_fake_server(tmp_path, "exec sleep 60")), startup_timeout_s=2),
                       "fa3", top=V1)
    with pytest.raises(SglangStartupError, match="did not answer GET /health within 2s .*startup_timeout_s"):
        eng.start()
    assert eng.server.proc is None  # the silent server was stopped


@pytest.mark.slow  # over 30 s (--durations, issue 25)
def test_distributed_sync_over_a_process_group(setup, tmp_path):
    """Trainer = this process (rank 0), server = the stand-in process (rank 1); gloo stands in for NCCL."""
    import torch.distributed as dist

    cfg = _cfg(setup, tmp_path, restart_on_failure=True)
    eng = SglangEngine(cfg, "fa3", top=V1)
    group = None
    try:
        eng.start()
        from datetime import timedelta

        from top_rl.driver import rendezvous

        port, name = rendezvous.reserve("127.0.0.1"), f"{cfg.weight_group_name}_0"  # a store on 127.0.0.1 only
        t = threading.Thread(target=lambda: eng.join_weight_group("127.0.0.1", port, "gloo", name))
        t.start()
        group = sglang_distributed.init_trainer_group("127.0.0.1", port, 2, name, backend="gloo",
                                                      store=rendezvous.store("127.0.0.1", port, 2, 0,
                                                                             timedelta(seconds=120)))
        t.join()
        assert eng.weights.group == name
        other = tiny_model(seed=6)
        for version, flattened in enumerate((True, False), 1):  # SglangDistributed's two ends, without Ray
            eng.cfg = eng.cfg.replace(flattened_buckets=flattened)  # the config is frozen: the test swaps it
            sglang_distributed.sync_distributed(
                hf_state_dict(other).items(), 0, functools.partial(in_thread, eng.receive_bucket),
                functools.partial(sglang_distributed.broadcast_bucket, group=group, flattened=flattened),
                weight_version=str(version))
            got = eng.generate(PROMPTS, SEEDS, PARAMS)
            assert [s.logprobs for s in got] == [s.logprobs for s in NativeEngine(other).generate(PROMPTS, SEEDS, PARAMS)]
        assert got[0].meta["weight_version"] == "2"
        _kill(eng)
        with pytest.raises(SglangEngineRestarted, match="join_weight_group.*sync the trainer's weights again"):
            eng.generate(PROMPTS, SEEDS, PARAMS)  # restarted, but broadcast weights cannot be replayed
        assert eng.health() and eng.server.starts == 2
        with pytest.raises(SglangEngineRestarted):  # and it keeps refusing until the trainer syncs
            eng.score(PROMPTS, [[1], [2]])
    finally:
        if group is not None:
            dist.destroy_process_group(group)
        eng.shutdown()


def _blocked_signals(pid: int) -> set[int]:
    mask = int(next(line for line in open(f"/proc/{pid}/status") if line.startswith("SigBlk:")).split()[1], 16)
    return {sig for sig in range(1, 65) if mask >> (sig - 1) & 1}


def test_server_sees_stop_signals_even_when_its_launcher_blocks_them(setup, tmp_path):
    """A local run starts Ray's processes, the engine actor among them, with SIGINT/SIGTERM/SIGHUP blocked
    (top_rl/driver/local_ray.py); the server it launches must not inherit that mask, or stop() waits out its grace period
    and the server outlives a run's shutdown."""
    import time

    stop = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    eng = SglangEngine(_cfg(setup, tmp_path), "fa3", top=V1)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    try:
        eng.start()
        assert stop <= _blocked_signals(os.getpid())  # the launcher blocks them ...
        assert not stop & _blocked_signals(eng.server.proc.pid)  # ... the server does not
        t0 = time.monotonic()
        eng.server.stop(grace_s=20)
        assert time.monotonic() - t0 < 10  # SIGTERM ended it; no SIGKILL after the grace period
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        eng.shutdown()
