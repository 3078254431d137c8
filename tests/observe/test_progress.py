"""The rollout's console line (top_rl/observe/progress.py): nothing for a short rollout, then samples, tokens and
tokens per second summed over the engines; redrawn in place and erased on a terminal, a plain line now and then in
a log."""

from __future__ import annotations

import io

from top_rl.observe import progress


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class _Tty(io.StringIO):
    def isatty(self):
        return True


def _engines(*parts):
    return lambda: list(parts)


def test_a_short_rollout_shows_nothing_and_a_long_one_sums_the_engines():
    clock, out = _Clock(), io.StringIO()
    with progress.RolloutProgress(512, _engines({"samples_done": 64, "tokens": 65536}, None,
                                                {"samples_done": 32, "tokens": 32768}), out, clock) as shown:
        clock.t = 2.0
        shown.poll()
        assert out.getvalue() == ""
        clock.t = 10.0
        shown.poll()
        clock.t = 12.0
        shown.poll()  # within LOG_EVERY_S of the last line: nothing more in a log
    assert out.getvalue() == "[top-rl] rollout 96/512 samples | 98,304 tokens | 9,830 tok/s | 10 s\n"


def test_on_a_terminal_the_line_is_redrawn_and_erased_so_the_step_line_keeps_its_form():
    clock, out = _Clock(), _Tty()
    with progress.RolloutProgress(8, _engines({"samples_done": 4, "tokens": 40}), out, clock) as shown:
        clock.t = 4.0
        shown.poll()
        clock.t = 5.0
        shown.poll()
    text = out.getvalue()
    assert text.count("\r\033[K") == 3 and text.endswith("\r\033[K")
    assert "rollout 4/8 samples | 40 tokens | 8 tok/s | 5 s" in text


def test_waves_add_up_and_an_engine_that_cannot_answer_shows_nothing():
    clock, out = _Clock(), io.StringIO()

    def broken():
        raise TimeoutError("engine busy")
    with progress.RolloutProgress(10, broken, out, clock) as shown:
        clock.t = 5.0
        shown.poll()
        assert out.getvalue() == ""
        shown.read = _engines({"samples_done": 1, "tokens": 3})
        shown.wave_done(5, 15)
        shown.poll()
    assert "rollout 6/10 samples | 18 tokens" in out.getvalue()


def test_engines_that_report_their_servers_load_show_what_runs_before_any_sample_finishes():
    """At 1024 new tokens the samples finish together at the end (the H200's 4B job read `0/512 samples | 0 tokens`
    for ~35 s): an engine's running requests and generation rate (SGLang's /v1/loads) show it is generating. Only
    engines that report them are summed; none reporting leaves the line as it was."""
    clock, out = _Clock(), io.StringIO()
    with progress.RolloutProgress(512, _engines({"samples_done": 0, "tokens": 0, "running": 256, "engine_tok_s": 4600.5},
                                                {"samples_done": 0, "tokens": 0, "running": 256, "engine_tok_s": 4600.0},
                                                {"samples_done": 0, "tokens": 0}), out, clock) as shown:
        clock.t = 20.0
        shown.poll()
    assert out.getvalue() == ("[top-rl] rollout 0/512 samples (512 running) | 0 tokens | 0 tok/s | engine 9,200 tok/s"
                              " | 20 s\n")
