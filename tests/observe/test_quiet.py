"""A quiet console (top_rl/observe/quiet.py): third-party start-up notices are filtered, each by its module and text,
in the driver and in every Ray actor; TOP-RL's own warnings and other third-party messages still show."""

from __future__ import annotations

import logging
import warnings

import pytest

from tests import rl_runs

from top_rl.observe import quiet

# What a run printed before top_rl.observe.quiet (driver and every actor), written out here rather than read from
# quiet.py so the test checks the console, not the table.
NOTICES = ["Transformer Engine and Apex are not installed", "Apex is not installed. Falling back to Torch Norm",
           "absl.logging is not installed", "full scope is deprecated", "GPTModel IS DEPRECATED",
           "No CUDA runtime is found", "Token authentication is enabled for this Ray cluster"]


def _shown(message: str, module: str) -> bool:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet.install()
        warnings.warn_explicit(message, UserWarning, f"{module.replace('.', '/')}.py", 1, module=module)
    return bool(seen)


def test_warning_filters_are_specific(monkeypatch):
    monkeypatch.setenv("PYTHONWARNINGS", "default::DeprecationWarning")
    apex = "Apex is not installed. Falling back to Torch Norm"
    assert not _shown(apex, "megatron.core.models.backends")
    assert not _shown("Transformer Engine and Apex are not installed. Falling back to Torch optimizers.",
                      "megatron.core.optimizer")
    assert _shown(apex, "top_rl.train.qwen3_megatron")  # our own module: never hidden
    assert _shown("something else", "megatron.core.models.backends")  # another message from that module
    assert _shown(apex, "megatron.core.models.backends_other")  # module matched exactly, not as a prefix
    env = __import__("os").environ["PYTHONWARNINGS"].split(",")
    assert env[0] == "default::DeprecationWarning"  # the user's entries are kept, ours appended once
    assert env.count("ignore:absl.logging is not installed:UserWarning:megatron.core.hyper_comm_grid") == 1


def test_log_filters_drop_only_the_notice():
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger("megatron.core.models.gpt.gpt_model")
    log.addHandler(handler)
    try:
        quiet.install()
        quiet.install()
        log.warning("GPTModel IS DEPRECATED. GPTModel is only accepting critical bug fixes")
        log.warning("GPTModel got a bad config")
    finally:
        log.removeHandler(handler)
    assert [r.getMessage() for r in records] == ["GPTModel got a bad config"]
    assert sum(isinstance(f, quiet._DropPrefix) for f in log.filters) == 1


@pytest.mark.slow
def test_a_run_prints_none_of_the_notices(tmp_path):
    out = rl_runs.run(tmp_path / "run", *rl_runs.BASE, "steps=2")
    assert out.returncode == 0, out.stderr[-4000:]
    shown = [n for n in NOTICES if n in out.stderr]
    assert not shown, f"notices on stderr: {shown}\n{out.stderr[-4000:]}"
