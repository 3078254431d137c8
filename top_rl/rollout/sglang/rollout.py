"""One rollout on an SGLang server at the engine's pace: the samples go as concurrent /generate calls of
`request_batch_size` each, and each call's samples are re-scored (the prefill log-prob source) as soon as that call
returns, so the re-score of the first finished samples overlaps the generation of the others instead of waiting for
the slowest. Batch invariance (the contract) makes every sample's tokens and log-probs the same whichever calls
share the server with it. While it runs, `Progress` counts the samples and tokens done (what the driver's console
line shows) and a poller reads the server's /v1/loads for the peak running requests and KV-pool use."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Progress:
    """What a rollout in flight has done; read from another thread (the engine actor's progress())."""

    samples: int = 0
    samples_done: int = 0
    tokens: int = 0
    started: float = field(default_factory=time.perf_counter)
    # the server's own view, from the load poller (None until it answers): samples finish together at a long
    # max_new_tokens, so the finished count stays 0 for most of a rollout while these show it is generating
    running: int | None = None  # requests the server is running now
    engine_tok_s: float | None = None  # its generation throughput now (SGLang's gen_throughput)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, samples: int, tokens: int) -> None:
        with self._lock:
            self.samples_done += samples
            self.tokens += tokens

    def load(self, running: int, engine_tok_s: float) -> None:
        with self._lock:
            self.running, self.engine_tok_s = running, engine_tok_s

    def snapshot(self) -> dict:
        with self._lock:
            out = {"samples": self.samples, "samples_done": self.samples_done, "tokens": self.tokens,
                   "seconds": time.perf_counter() - self.started}
            if self.running is not None:
                out.update(running=self.running, engine_tok_s=self.engine_tok_s)
            return out


class LoadPoller:
    """Polls `read()` (the server's /v1/loads) every `every_s` on a thread: the peak of running requests and of the
    KV pool's use over the rollout, and each reading's running requests and generation throughput to `on_load` (the
    rollout's Progress). A server that does not answer it leaves the peaks unset."""

    def __init__(self, read: Callable[[], dict], every_s: float = 0.5,
                 on_load: Callable[[int, float], None] | None = None):
        self.read, self.every_s, self.on_load = read, every_s, on_load
        self.peak_running: int | None = None
        self.peak_kv_use: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "LoadPoller":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self.peak_running is not None and self.on_load is not None:
            self.on_load(0, 0.0)  # this engine's rollout is over: its last reading must not count beside the others'

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                loads = self.read().get("loads") or []
            except Exception:  # noqa: BLE001 - an old or stand-in server without /v1/loads: no peaks, no failure
                return
            running_now, rate_now = 0, 0.0
            for load in loads:
                running = int(load.get("num_running_reqs", 0))
                use = float(load.get("token_usage", 0.0))
                self.peak_running = max(self.peak_running or 0, running)
                self.peak_kv_use = max(self.peak_kv_use or 0.0, use)
                running_now, rate_now = running_now + running, rate_now + float(load.get("gen_throughput", 0.0))
            if loads and self.on_load is not None:
                self.on_load(running_now, rate_now)
            self._stop.wait(self.every_s)


@dataclass
class RolloutStats:
    """One rollout's timings (seconds of wall time from its start) and the server's peaks."""

    generate_s: float  # until the last /generate call returned
    rescore_s: float  # wall seconds in which some re-score ran (the union of their spans: they overlap each other
                      # and generation, so their sum would count one second many times)
    rescore_tail_s: float  # from the last generation's return to the last re-score's: what the re-score added
    peak_running_requests: int | None
    peak_kv_use: float | None

    def metrics(self) -> dict:
        """Under perf/: they vary from run to run (a resumed run's rows equal the straight run's without them)."""
        out = {"perf/rollout_generate_s": self.generate_s, "perf/rollout_rescore_s": self.rescore_s,
               "perf/rollout_rescore_tail_s": self.rescore_tail_s}
        if self.peak_running_requests is not None:
            out["perf/rollout_peak_running_requests"] = self.peak_running_requests
        if self.peak_kv_use is not None:
            out["perf/rollout_peak_kv_use"] = self.peak_kv_use
        return out


def union_seconds(spans: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end] spans: the wall time in which at least one of them ran."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def run_chunks(chunks: list[range], generate: Callable[[range], list], score: Callable[[range, list], list] | None,
               progress: Progress, poller: LoadPoller) -> tuple[list, list, RolloutStats]:
    """Every chunk generated concurrently, each re-scored (`score`, None: the decode source needs none) right after.
    Returns the generations and the gate's scores in sample order, and the stats. The first failure is raised once
    every call has ended (the caller's retry then repeats the whole rollout: seeds make it the same)."""
    start = time.perf_counter()
    ends: dict[str, list] = {"gen": [], "score_end": [], "score": []}
    lock = threading.Lock()

    def one(r: range):
        gens = generate(r)
        t = time.perf_counter()
        scores = score(r, gens) if score is not None else None
        with lock:
            ends["gen"].append(t)
            if score is not None:
                done = time.perf_counter()
                ends["score"].append((t, done))
                ends["score_end"].append(done)
        progress.add(len(r), sum(len(g.output_ids) for g in gens))
        return gens, scores

    with poller, ThreadPoolExecutor(max_workers=max(1, len(chunks)), thread_name_prefix="sglang-rollout") as pool:
        futures = [pool.submit(one, r) for r in chunks]
        results = [f.result() for f in futures]
    gens = [g for part, _ in results for g in part]
    scores = [s for _, part in results for s in part] if score is not None else None
    last_gen = max(ends["gen"], default=start)
    stats = RolloutStats(generate_s=last_gen - start, rescore_s=union_seconds(ends["score"]),
                         rescore_tail_s=max(ends["score_end"], default=last_gen) - last_gen,
                         peak_running_requests=poller.peak_running, peak_kv_use=poller.peak_kv_use)
    return gens, scores, stats
