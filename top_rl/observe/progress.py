"""The console line of a rollout in flight: samples done, tokens generated and tokens per second, and where the engines
report it (SGLang's /v1/loads) the requests running and the engines' own generation rate, once the rollout has
run for a few seconds (a short one shows nothing, so a CPU step's line stays alone). On a terminal the line is
redrawn in place on stderr and erased at the end, so the step line keeps its form; in a log (no terminal) it is
printed every `LOG_EVERY_S` seconds as its own `[top-rl] rollout ...` line."""

from __future__ import annotations

import sys
import time
from typing import Callable

SHOW_AFTER_S = 3.0
LOG_EVERY_S = 15.0


def line(done: int, total: int, tokens: int, seconds: float, running: int | None = None,
         engine_tok_s: float | None = None) -> str:
    """`tokens`: of the finished samples; `running` / `engine_tok_s`: the servers' running requests and generation
    throughput now, where they report them (SGLang's /v1/loads): at a long max_new_tokens the samples finish together
    at the end, and these show the rollout generating before any has finished."""
    rate = tokens / seconds if seconds > 0 else 0.0
    now = f" ({running} running)" if running is not None else ""
    engine = f" | engine {engine_tok_s:,.0f} tok/s" if engine_tok_s is not None else ""
    return f"rollout {done}/{total} samples{now} | {tokens:,} tokens | {rate:,.0f} tok/s{engine} | {seconds:.0f} s"


class RolloutProgress:
    """`poll()` while the engines generate; `read()` returns each engine's progress of its call in flight (a dict with
    samples_done and tokens, or None where the engine does not count); `wave_done` adds a finished wave's totals."""

    def __init__(self, total: int, read: Callable[[], list], stream=None, clock=time.perf_counter):
        self.total, self.read, self.clock = total, read, clock
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.base_done = self.base_tokens = 0
        self.shown = False
        self.last_log = None

    def __enter__(self) -> "RolloutProgress":
        self.start = self.clock()
        return self

    def __exit__(self, *exc) -> None:
        if self.shown and self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def wave_done(self, samples: int, tokens: int) -> None:
        self.base_done, self.base_tokens = samples + self.base_done, tokens

    def poll(self) -> None:
        seconds = self.clock() - self.start
        if seconds < SHOW_AFTER_S:
            return
        try:
            parts = [p for p in self.read() if p]
        except Exception:  # noqa: BLE001 - progress is a courtesy: an engine that cannot answer now shows nothing
            return
        done = self.base_done + sum(p["samples_done"] for p in parts)
        tokens = self.base_tokens + sum(p["tokens"] for p in parts)
        loads = [p for p in parts if p.get("running") is not None]  # engines that report their server's load
        text = line(done, self.total, tokens, seconds, sum(p["running"] for p in loads) if loads else None,
                    sum(p["engine_tok_s"] for p in loads) if loads else None)
        if self.tty:
            self.stream.write("\r\033[K" + text)
            self.stream.flush()
            self.shown = True
        elif self.last_log is None or seconds - self.last_log >= LOG_EVERY_S:
            print(f"[top-rl] {text}", file=self.stream, flush=True)
            self.last_log, self.shown = seconds, True
