"""The SGLang rollout engine: one `sglang.launch_server` child process behind the `RolloutEngine` interface.

A plain class, so a caller can place it with Ray: `ray.remote(num_gpus=1)(SglangEngine).remote(cfg, "fa3")`, then
`start`. Without `start()` it talks to a server already listening at cfg.url (restart is then impossible).

- Refusals (config.check_config) run in the constructor, the installed-version check in `start()`: all
  before the server process, which is what touches the GPU, exists. `start()` also parses the command with
  SGLang's own parser and, once the server is up, checks its /server_info against the contract.
- generate: one batch /generate with a distinct `sampling_seed` per sample and the contract's sampling; the
  gate's log-probs come from prefill re-scoring (default) or the sampler's output_token_logprobs.
- Weights: the engine side of the weight seam (top_rl/engine/interface.py's EngineWeights), each way the receiving end
  of one variant of top_rl.weights (chosen there by cluster.weight_transport): CUDA IPC handles (load_ipc_buckets),
  a group joined (join_weight_group) and bucket receives of rank 0's broadcast (receive_bucket), or whole tensors
  written next to the server and reloaded (load_named_tensors, load_directory: disk). Each update carries a
  weight_version and every later answer must report it, so a server that restarted with its initial weights cannot
  pass silently. What the engine knows of its server's weights is one WeightState (weight_state.py).
- A failed idempotent call (generation with fixed seeds, re-scoring) on a dead server restarts it and retries
  once; after a restart the last disk version is reloaded, while IPC or broadcast weights cannot be restored
  here and the retry is refused (`SglangEngineRestarted`) until the trainer syncs again.
- The config is frozen: what a run resolves (ports, weights dir) the plan did (plan.py); the group an engine joins is
  named by the connection (top_rl.weights), and kept in the WeightState.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from top_rl import contract
from top_rl.rollout.sglang.disk import write_hf_checkpoint
from top_rl.engine.interface import RolloutEngine, RolloutSample, SamplingParams
from top_rl.rollout.sglang.client import SglangClient, SglangError, SglangProtocolError, SglangUnavailable
from top_rl.rollout.sglang.config import (SglangEngineConfig, TopConfigError, check_config, check_sampling,
                                          check_sglang_version)
from top_rl.rollout.sglang.launch import build_launch, validate_argv
from top_rl.rollout.sglang.protocol import generate_payload, items, parse_generation, parse_scores, score_payload
from top_rl.rollout.sglang.rollout import LoadPoller, Progress, RolloutStats, run_chunks
from top_rl.rollout.sglang.server import ServerProcess
from top_rl.rollout.sglang.weight_state import SglangEngineRestarted, WeightState

log = logging.getLogger(__name__)
__all__ = ["SglangEngine", "SglangEngineConfig", "SglangEngineRestarted", "TopConfigError"]


class SglangEngine(RolloutEngine):
    def __init__(self, cfg: SglangEngineConfig, trainer_attention_backend: str, top: contract.TopContract):
        check_config(cfg, trainer_attention_backend, top, check_version=False)
        self.cfg, self.top = cfg, top
        self.logprob_source = cfg.logprob_source
        self.spec = build_launch(cfg, trainer_attention_backend, top=top, check=False)
        self.client = SglangClient(cfg.url, cfg.request_timeout_s, cfg.max_retries, cfg.retry_backoff_s)
        log_path = cfg.log_path or str(Path(cfg.weights_dir or tempfile.gettempdir()) / f"sglang-{cfg.port}.log")
        self.server = ServerProcess(self.spec, self.client, log_path)
        self.vocab_size = _vocab_size(cfg.model_path)
        self.weights = WeightState()
        # disk: where versions are written; the plan resolves run_dir/engines/<i>, a bare engine (tests, bench) a
        # temp dir made on first use
        self.weights_dir: str | None = cfg.weights_dir or None
        self.progress: Progress | None = None  # the rollout in flight (or the last one)
        self.last_stats: RolloutStats | None = None

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> dict:
        """Launch the server and wait for /health; returns its /server_info."""
        check_sglang_version(self.cfg, self.top)
        if self.cfg.validate_with_parser:
            validate_argv(self.spec.argv, self.cfg, self.top)
        log.info("starting SGLang: %s", " ".join(self.spec.argv))
        self.server.start(self.cfg.startup_timeout_s)
        return self.verify_server()

    def verify_server(self) -> dict:
        """Refuse a running server whose release or flags are not the contract's (its /server_info)."""
        info = self.client.server_info()
        want = {"attention_backend": self.cfg.attention_backend, "tp_size": self.cfg.tp_size,
                "skip_tokenizer_init": True}
        if not self.cfg.skip_version_check:
            want["version"] = self.top.sglang_version
        if self.cfg.top:
            want.update(enable_deterministic_inference=True, rl_on_policy_target="fsdp")
            if self.cfg.attention_backend in self.top.radix_cache_required_off:
                want["disable_radix_cache"] = True
        bad = [f"{k}={info.get(k)!r} (need {v!r})" for k, v in want.items() if info.get(k) != v]
        if bad:
            raise TopConfigError(f"the server at {self.cfg.url} does not run the TOP contract: {'; '.join(bad)}. "
                                 f"Relaunch it with the command from top_rl.rollout.sglang.launch.build_launch")
        return info

    def health(self) -> bool:
        if self.server.proc is not None and not self.server.alive():
            return False
        return self.client.health()

    def restart(self) -> None:
        log.warning("restarting the SGLang server on %s; last log lines:\n%s", self.cfg.url, self.server.log_tail(20))
        self.server.stop()
        self.server.start(self.cfg.startup_timeout_s)
        self.verify_server()
        replay = self.weights.restarted()
        if replay is not None:
            self.client.update_weights_from_disk(replay, weight_version=self.weights.expected)
        elif self.weights.version:  # a version it cannot replay was lost: refused until the trainer syncs again
            self._refuse_stale()

    @property
    def version(self) -> int:
        """The weight version the server holds (the trainer's number of the last update; 0: its launch checkpoint)."""
        return self.weights.version

    def _refuse_stale(self) -> None:
        refusal = self.weights.refusal(self.cfg.url, self.cfg.model_path)
        if refusal is not None:
            raise refusal

    def shutdown(self) -> None:
        self.server.stop()
        self.client.close()

    def _explained(self, e: SglangUnavailable) -> SglangUnavailable:
        """A request our own server did not answer because it died: say so, with its exit code and last log lines
        (the cause, e.g. an out-of-memory at resume, is only in the server's log)."""
        if self.server.proc is None or self.server.alive():
            return e
        return SglangUnavailable(f"{e}; the server process exited with code {self.server.proc.returncode}; last log "
                                 f"lines ({self.server.log_path}):\n{self.server.log_tail()}", e.endpoint, e.status)

    def _call(self, fn: Callable, idempotent: bool):
        try:
            return fn()
        except SglangUnavailable as e:
            if not (idempotent and self.cfg.restart_on_failure and self.server.proc is not None):
                raise self._explained(e) from None
            if self.health():
                raise  # the server is up: the failure was not a dead server, so a restart would not help
            self.restart()
            return fn()

    # ------------------------------------------------------------------------------------ rollout
    def sampling(self, params: SamplingParams) -> dict:
        sp = {"max_new_tokens": params.max_new_tokens, "temperature": params.temperature, **self.cfg.extra_sampling}
        if params.stop_token_ids:
            sp["stop_token_ids"] = [int(t) for t in params.stop_token_ids]
        if self.cfg.top:
            check_sampling(sp, self.top)
        return sp

    def _chunks(self, n: int) -> list[range]:
        step = self.cfg.request_batch_size or max(n, 1)
        return [range(i, min(i + step, n)) for i in range(0, n, step)]

    def _check_version(self, meta: dict, i: int) -> None:
        have, expected = meta.get("weight_version"), self.weights.expected
        if expected is not None and have is not None and have != expected:
            raise SglangProtocolError(
                f"POST /generate: sample {i} was produced with weight_version {have!r}, expected "
                f"{expected!r} (did the server restart or miss a weight update?)", "POST /generate")

    def generate(self, prompts, seeds, params: SamplingParams) -> list[RolloutSample]:
        """The samples as concurrent calls, each re-scored as it returns (rollout.run_chunks). A dead server is
        restarted and the whole rollout repeated once (fixed seeds: the same answer)."""
        self._refuse_stale()
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        sp = self.sampling(params)
        prefill = self.logprob_source == "prefill"

        def generate(r: range) -> list:
            resp = self.client.generate(generate_payload([prompts[i] for i in r], [seeds[i] for i in r], sp))
            gens = [parse_generation(item, r[k]) for k, item in enumerate(items(resp, len(r)))]
            for k, g in enumerate(gens):
                self._check_version(g.meta, r[k])
            return gens

        def score(r: range, gens: list) -> list:
            return self._score([prompts[i] for i in r], [g.output_ids for g in gens], r.start)

        def rollout():
            self.progress = Progress(samples=len(prompts))
            poller = LoadPoller(lambda: self.client.request("GET", "/v1/loads", params={"include": "core"}, timeout=10),
                                on_load=self.progress.load)
            return run_chunks(self._chunks(len(prompts)), generate, score if prefill else None, self.progress, poller)

        gens, scores, self.last_stats = self._call(rollout, idempotent=True)
        gate = scores if prefill else [g.logprobs for g in gens]
        return [RolloutSample(list(p), g.output_ids, lp, g.logprobs, g.finish_reason, int(s), dict(g.meta))
                for p, g, lp, s in zip(prompts, gens, gate, seeds)]

    def rollout_metrics(self) -> dict:
        """The last rollout's timings and the server's peaks (rollout.RolloutStats)."""
        return self.last_stats.metrics() if self.last_stats is not None else {}

    def score(self, prompts, responses) -> list[list[float]]:
        """Prefill re-scoring (§6.1, §8): fp32, no temperature; entries 1..|R| of input_token_logprobs."""
        self._refuse_stale()
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        out: list[list[float]] = []
        for r in self._chunks(len(prompts)):
            part = [prompts[i] for i in r], [responses[i] for i in r]
            out += self._call(lambda part=part, r=r: self._score(*part, r.start), idempotent=True)
        return out

    def _score(self, prompts, responses, first: int) -> list[list[float]]:
        """One re-score call for these samples (`first`: the index of the first, for messages)."""
        out: list[list[float]] = [[] for _ in prompts]
        todo = [i for i, r in enumerate(responses) if len(r)]
        if not todo:
            return out
        resp = self.client.generate(score_payload([prompts[i] for i in todo], [responses[i] for i in todo]))
        for i, item in zip(todo, items(resp, len(todo))):
            out[i] = parse_scores(item, first + i, list(prompts[i]), list(responses[i]), self.vocab_size)
            self._check_version(item.get("meta_info", {}), first + i)
        return out

    # ------------------------------------------------------------------------------------ weights (EngineWeights)
    def _synced(self, version: str) -> None:
        self.weights.synced(version)
        self.client.flush_cache(timeout_s=30.0)  # the update flushed already; this also covers a busy scheduler

    def load_directory(self, path: str, version: int | None = None) -> str:
        """Load an HF checkpoint the trainer wrote (visible to the server at `path`) as weight version `version`
        (default: the one after this engine's last); returns the weight_version the server now reports."""
        path, version = str(path), str(self.weights.next_version(version))
        self._call(lambda: self.client.update_weights_from_disk(path, weight_version=version), idempotent=True)
        self.weights.loaded_from_disk(path, version)
        self._synced(version)
        return version

    def load_named_tensors(self, named: dict, version: int | None = None) -> None:
        """A whole version (cluster.weight_transport=disk, top_rl.weights.native.SglangDisk): written as an HF
        checkpoint next to the server and reloaded as weight version `version`, the trainer's (a resumed run or a
        replaced engine pushes 1 then 4: numbering them here would stamp samples with a version the loop does not
        expect); without one, the next after this engine's last. The older version directories are deleted."""
        if self.weights_dir is None:  # the engine writes next to its server: a local temp dir is visible to it
            self.weights_dir = tempfile.mkdtemp(prefix=f"top_rl_sglang_{self.cfg.port}_")
        version = self.weights.next_version(version)
        root = Path(self.weights_dir)
        path = write_hf_checkpoint(named, root / f"v{version:06d}", self.cfg.model_path)
        self.load_directory(str(path), version)
        # the newest written are kept, never the one loaded: versions need not rise (a resume may push a lower one)
        older = sorted((p for p in root.glob("v[0-9]*") if p != path), key=lambda p: p.stat().st_mtime_ns)
        for old in older[:max(len(older) - max(self.cfg.keep_weight_versions, 1) + 1, 0)]:
            shutil.rmtree(old, ignore_errors=True)

    def load_ipc_buckets(self, buckets: list[tuple[list[str], str | None]], version: int) -> None:
        """Version `version` as IPC-serialised buckets (top_rl.weights.sglang_ipc: one (serialized_named_tensors,
        load_format) per bucket, made by trainer rank 0): one POST each; the last flushes the cache and flips the
        server's weight_version."""
        version = str(version)
        for k, (serialized, fmt) in enumerate(buckets):
            last = k == len(buckets) - 1
            self.client.update_weights_from_tensor(serialized, load_format=fmt, flush_cache=last,
                                                   weight_version=version if last else None)
        self._synced(version)

    def join_weight_group(self, host: str, port: int, backend: str, name: str) -> None:
        """This server's ranks join trainer rank 0's broadcast group `name` (unique per engine and connection: rank 0
        holds one group per engine) as ranks 1..tp_size of it. Blocks until rank 0 joins: call it concurrently with
        top_rl.weights.sglang_distributed.init_trainer_group."""
        self.client.init_weights_update_group(host, port, 1, 1 + self.cfg.tp_size, name, backend)
        self.weights.joined(name)

    def receive_bucket(self, names, dtypes, shapes, weight_version: str | None = None) -> None:
        """One bucket's receive over the joined group (returns after the trainer's broadcast). `weight_version` marks
        the last bucket."""
        if self.weights.group is None:
            raise SglangError(f"the SGLang server on {self.cfg.url} was sent a bucket before joining a weight group: "
                              "join_weight_group first")
        self.client.update_weights_from_distributed(
            names, dtypes, shapes, self.weights.group, weight_version=weight_version,
            flush_cache=weight_version is not None, load_format="flattened_bucket" if self.cfg.flattened_buckets else None)
        if weight_version is not None:
            self._synced(weight_version)

    def leave_weight_group(self) -> dict:
        name, _ = self.weights.group, self.weights.left_group()
        return self.client.destroy_weights_update_group(name)

    # ------------------------------------------------------------------------------------ the GPU handed over
    def release_memory(self) -> None:
        """Give the GPU back while the trainer on it trains (cluster.gpu_handoff): weights, KV pool and CUDA graphs.
        Until `resume_memory` and the next weight push every request is refused (the weights are gone).
        No flush is needed first, radix cache on or off: SGLang 0.5.11's scheduler asserts it is idle, pauses the KV
        pool and flushes itself (radix tree, request and token pools; scheduler_update_weights_mixin.py), and the
        push after the resume flushes again."""
        self._call(self.client.release_memory_occupation, idempotent=False)  # no restart: the step would lose it
        self.weights.released_memory()

    def resume_memory(self) -> None:
        """Take the memory back, empty: the KV cache holds nothing and the weights come by the push that follows."""
        self._call(self.client.resume_memory_occupation, idempotent=False)
        self.weights.resumed_memory()


def _vocab_size(model_path: str) -> int | None:
    """For the pinned scheduler's token-id quirk (protocol.same_token); None for a hub id."""
    try:
        return int(json.loads((Path(model_path) / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
