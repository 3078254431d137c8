"""Ray placement and the calls the RL loop makes: rollout engines and the trainer group (top_rl.driver.actors).

Locally this is `ray.init()` on this machine; on a cluster (`cluster.address` or RAY_ADDRESS) it joins the
running Ray. One placement group holds the bundles `top_rl.driver.placement` plans; every actor asks Ray for its
GPUs, so each gets its own device (or its share of one, colocated). The trainer ranks meet at rank 0's
node address. Trainer calls are SPMD: every rank gets the same call (batches travel once, as one object),
rank 0 answers.

Faults (top_rl.run.faults): results are awaited fail-fast, so the first actor that dies or raises surfaces
as `ActorFailed` naming it, without waiting on its SPMD peers (which may be blocked in a collective with
it). A rollout engine that dies is replaced in its bundle by a fresh one, trainer rank 0 sends it the
current weights, and the call is repeated (at most `cluster.max_engine_restarts` times per run): a rollout
is a pure function of prompts, seeds and weights, so the repeat returns what the lost call would have.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from pathlib import Path

from top_rl.observe.progress import RolloutProgress
from top_rl.observe.startup import QUIET, StartupLog
from top_rl.run import faults
from top_rl.driver import local_ray
from top_rl.driver import placement
from top_rl.driver import rendezvous
from top_rl.driver import shared_run_dir
from top_rl.weights import senders, transport
from top_rl.driver.actors import EngineActor, TrainerActor
from top_rl.driver.plan import RunPlan
from top_rl.run.stopped import ActorFailed
from top_rl.driver.placement import ClusterConfig, PlacementError

WEIGHT_BUCKET_BYTES = 512 << 20


@dataclass
class PendingRollout:
    """A submitted rollout (Cluster.submit_generate): its waves of (prompts, seeds), the weight version the engines
    held when it was submitted, the calls of its first wave, and, once collected, how long the driver waited."""

    waves: list
    params: object
    version: int
    total: int
    first: list = field(default_factory=list)
    submitted: float = field(default_factory=time.perf_counter)
    waited_s: float = 0.0


def _threads(cfg: ClusterConfig) -> int:
    return cfg.torch_threads or os.cpu_count() or 1


def start_ray(cfg: ClusterConfig, address: str | None = None) -> str:
    """Start or join Ray; what it is, in words (the start-up line). `address`: the cluster to join (the run plan's,
    resolved once: top_rl.driver.resolution); None: a local Ray on this machine."""
    if ray.is_initialized():
        return "Ray already up in this process"
    if address:  # a cluster's workers do not inherit this process's warning filters: install them there too
        ray.init(address=address, log_to_driver=True,
                 runtime_env={"worker_process_setup_hook": "top_rl.observe.quiet.install"})
        return f"Ray cluster at {address} joined"
    else:  # a local run: every server Ray starts listens on loopback only (top_rl.driver.rendezvous)
        rendezvous.ray_on_loopback()
        local_ray.start(num_cpus=cfg.num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=True,
                        configure_logging=False)  # its processes survive a group SIGTERM/SIGHUP (top_rl.driver.local_ray)
        faults.raise_if_interrupted()  # a stop signal that came while Ray started: stop before placing actors
        return f"local Ray up ({cfg.num_cpus or os.cpu_count()} CPUs)"


class Cluster:
    def __init__(self, plan: RunPlan, startup: StartupLog = QUIET):
        """Place and start what `plan` (top_rl.driver.plan, built by preflight) names: the trainer ranks, then the
        engines, each connected for weights and sent the initial policy. `startup` says each of those as it
        happens (top_rl.observe.startup)."""
        cfg = plan.cluster
        self.logs = Path(plan.logs_dir) if plan.logs_dir else None
        startup.say("checks passed; starting Ray")
        startup.say(start_ray(cfg, plan.ray_address) + (f"; this run's logs: {self.logs}" if self.logs else ""))
        self.plan = plan.placement
        placement.check(self.plan, ray.cluster_resources(), "the Ray cluster")
        self.pg = placement_group(self.plan.bundles, strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=cfg.placement_timeout_s)
        except GetTimeoutError:
            remove_placement_group(self.pg)
            free = ray.available_resources()
            raise PlacementError(
                f"Ray could not place {self.plan.describe()} within {cfg.placement_timeout_s:g} s (cluster."
                f"placement_timeout_s); available now: {', '.join(f'{v:g} {k}' for k, v in sorted(free.items()) if k in ('CPU', 'GPU'))}"
                "; a bundle must fit on one node") from None
        self.threads = _threads(cfg)
        self.cfg, self.kernels, self.engine_specs = cfg, plan.kernels, plan.engines
        self.restarts_left, self.max_restarts = cfg.max_engine_restarts, cfg.max_engine_restarts
        self.rollout_chunk = cfg.rollout_chunk
        self.weight_version = 0
        self.faults = plan.faults  # test-only (top_rl.run.fault_injection): kill_engine, kill_trainer
        self.stop_check = lambda: None  # the loop's RunGuard.abandon_if_due, once it takes the signals

        t = plan.trainer
        t0 = startup.elapsed()
        self.trainers = [
            TrainerActor.options(scheduling_strategy=self._bundle(self.plan.trainer_bundle[r]), num_cpus=0,
                                 num_gpus=self.plan.trainer_gpus).remote(r, t.world, self.kernels, self.threads,
                                                                         self._log(f"trainer-rank{r}.log"))
            for r in range(t.world)
        ]
        # The engines' processes start beside the ranks' (their imports overlap the ranks' model builds); each engine
        # itself (its model, or its server) starts once the ranks are ready, below.
        self.engines = [self._new_engine(i) for i in range(len(self.engine_specs))]
        self._check_run_dir(plan.run_dir, startup)
        host, port = ray.get(self.trainers[0].free_address.remote())
        self._on_trainers("setup", [((host, port), t)] * t.world, "trainer setup")
        ends = ray.get([tr.endpoint.remote() for tr in self.trainers])
        self.trainer_endpoint = ends[0]
        for r, end in enumerate(ends):
            startup.say(f"trainer rank {r} ready on {end.node}{' GPU ' + end.gpu[:12] if end.gpu else ''} "
                        f"({startup.elapsed() - t0:.1f}s: model built, initial policy loaded)")
        if plan.initial_policy:
            # A server starts from a checkpoint on disk: the run's random initial policy, written by trainer rank 0
            # (the servers get the trainer's weights again by the first push, like every later version).
            self.save_hf(plan.initial_policy)
        t_engines = startup.elapsed()
        for i, spec in enumerate(self.engine_specs):
            startup.say(f"rollout engine {i} starting: " + (
                f"SGLang server on {spec.sglang.url}, log {spec.sglang.log_path}" if spec.sglang else
                f"{spec.kind} engine" + (f", log {self._log(f'engine-{i}.log')}" if self.logs else "")))
        started = self._start_engines(range(len(self.engines)))
        self.links = self._links(range(len(self.engines)))
        for i, secs in enumerate(started):
            startup.say(f"rollout engine {i} ready ({startup.elapsed() - t_engines:.1f}s since starting, "
                        f"{secs:.1f}s of it in its actor)")
        self.push_weights(connect=True)
        startup.say("initial weights sent to the engines")

    def _check_run_dir(self, run_dir: str | None, startup: StartupLog) -> None:
        """Refuse a run_dir some trainer rank's node does not see (top_rl.driver.shared_run_dir), before any rank
        builds its model; the ranks and the placement are removed first, so the refusal is the whole story."""
        if not run_dir:
            return
        token = shared_run_dir.write_token(run_dir)
        try:
            answers = ray.get([tr.check_run_dir.remote(run_dir, token, ("run_dir_unseen", r + 1) in self.faults.points)
                               for r, tr in enumerate(self.trainers)])
        finally:
            shared_run_dir.remove_token(run_dir)
        why = shared_run_dir.refusal(run_dir, [(r, node, seen) for r, (node, seen) in enumerate(answers)])
        if why:
            for actor in self.trainers + self.engines:
                ray.kill(actor, no_restart=True)
            remove_placement_group(self.pg)
            raise shared_run_dir.RunDirNotShared(why)
        nodes = sorted({node for node, _ in answers})
        startup.say(f"run_dir {run_dir} seen by every trainer rank ({len(nodes)} node{'s' * (len(nodes) > 1)})")

    def _log(self, name: str, restarted: bool = False) -> str | None:
        """A file in this run's log directory; `restarted`: a replaced actor's gets the next free name
        (engine-0.log, engine-0.restart1.log, ...), so the log of the one that died is kept."""
        if not self.logs:
            return None
        path, n = self.logs / name, 0
        while restarted and path.exists():
            n += 1
            path = self.logs / name.replace(".log", f".restart{n}.log")
        return str(path)

    def _bundle(self, index: int):
        return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=index)

    def _new_engine(self, i: int):
        """Engine i's actor: its process, in its bundle; `_start_engines` starts the engine in it."""
        return EngineActor.options(scheduling_strategy=self._bundle(self.plan.engine_bundle[i]), num_cpus=0,
                                   num_gpus=self.plan.engine_gpus,
                                   max_concurrency=2,  # progress() answers while generate runs
                                   ).remote(self.kernels, self.threads, self._log(f"engine-{i}.log", restarted=True))

    def _start_engines(self, indices) -> list[float]:
        """Start those engines (each its model or its server) and wait for them; the seconds each took in its actor."""
        indices = list(indices)
        return self._get([self.engines[i].start.remote(self.engine_specs[i]) for i in indices],
                         [f"rollout engine {i}" for i in indices], "start")

    def _links(self, indices) -> list[transport.Link]:
        """Each engine's link (top_rl.weights.senders.link), decided once here from cluster.weight_transport and where the
        engine computes (one round trip for all of them, once they started); an SGLang engine's link
        also carries its server's TP ranks and bucket layout."""
        indices = list(indices)
        ends = self._get([self.engines[i].endpoint.remote() for i in indices],
                         [f"rollout engine {i}" for i in indices], "start")
        return [senders.link(self.cfg.weight_transport, self.trainer_endpoint, end, self.engine_specs[i].sglang)
                for i, end in zip(indices, ends)]

    def _connect(self, i: int) -> tuple[list, list[str]]:
        """Submit engine i's connection: rank 0's end (its sender) and the engine's (its receiver); for a process
        group, the engine joins as rank 0 hosts it at an address rank 0 reserves: Ray hands the address over, the
        driver waits for nothing in between."""
        link, rank0 = self.links[i], self.trainers[0]
        address = rank0.free_address.remote() if link.needs_group else None
        return ([rank0.connect.remote(i, link, self.engines[i], address),
                 self.engines[i].join_weights.remote(link, i, address)], ["trainer rank 0", f"rollout engine {i}"])

    def _get(self, refs, names: list[str], what: str, poll=None) -> list:
        """ray.get, fail-fast: the first actor that dies or raises ends the wait (see module doc). `poll()`, if
        given, runs about every second while waiting, and so does `self.stop_check()`: a stop signal's grace may end
        the wait (top_rl.run.faults.RunGuard.abandon_if_due; the actors are killed on the way out)."""
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            if not ready:
                self.stop_check()
                if poll is not None:
                    poll()
                continue
            i = index[ready[0]]
            try:
                ray.get(ready[0])
            except RayActorError as e:
                reason = " ".join(str(e).split())[:600]
                raise ActorFailed(f"{names[i]} died during {what}: {reason}", names[i], True, i) from e
            except RayTaskError as e:
                raise ActorFailed(f"{names[i]} failed during {what}:\n{e}", names[i], False, i) from e
        return ray.get(refs)

    # ---------------------------------------------------------------- engines
    def _on_engines(self, submit, what: str, fault: str | None = None, poll=None, refs=None) -> list:
        """`submit(i, engine) -> ref` on every engine; a dead engine is replaced and the call repeated. `poll()` runs
        every second while the calls are out (the rollout's progress line). `refs`: the calls already submitted (an
        asynchronous rollout's; `submit` repeats them after a restart)."""
        while True:
            if refs is None:
                refs = [submit(i, e) for i, e in enumerate(self.engines)]
                if fault:
                    self.faults.inject(fault, actor=self.engines[0])
            try:
                return self._get(refs, [f"rollout engine {i}" for i in range(len(refs))], what, poll)
            except ActorFailed as e:
                if not e.died:
                    raise
                self._replace_engine(e.index, str(e), what)
                refs = None

    def _replace_engine(self, i: int, failure: str, what: str) -> None:
        name = f"rollout engine {i}"
        if self.restarts_left <= 0:
            raise ActorFailed(f"{failure}\nNo engine restarts left (cluster.max_engine_restarts={self.max_restarts}).",
                              name, True, i)
        self.restarts_left -= 1
        print(f"[top-rl] {failure}\n[top-rl] restarting {name} with the current weights (version "
              f"{self.weight_version}) and repeating the {what} (restart {self.max_restarts - self.restarts_left} of "
              f"{self.max_restarts})", flush=True)
        ray.kill(self.engines[i], no_restart=True)  # it may only be unreachable
        self.engines[i] = self._new_engine(i)
        self._start_engines([i])
        self.links[i] = self._links([i])[0]
        self.push_weights([i], connect=True)

    def generate(self, prompts, seeds, params):
        """Split samples over engines (in waves of cluster.rollout_chunk per engine); a sample's result
        depends only on its prompt, seed and the weights, never on its engine or batch. A rollout longer than a few
        seconds shows its progress on the console (top_rl.observe.progress)."""
        return self.collect(self.submit_generate(prompts, seeds, params))

    def submit_generate(self, prompts, seeds, params) -> "PendingRollout":
        """Start a rollout and return at once (rollout.policy_lag: it generates while the trainer steps); `collect`
        waits for it. Its first wave is submitted now (the whole rollout with cluster.rollout_chunk=0), the others
        when it is collected. No weight push may come between the two: the engines would sample the rest of it
        with other weights (the loop pushes only after collecting; the samples' versions prove it)."""
        n_eng = len(self.engines)
        wave = self.rollout_chunk * n_eng if self.rollout_chunk > 0 else len(prompts)
        waves = [(prompts[w : w + wave], seeds[w : w + wave]) for w in range(0, len(prompts), wave)]
        pending = PendingRollout(waves, params, self.weight_version, len(prompts))
        if waves:
            pending.first = [self._wave_call(waves[0], params)(i, e) for i, e in enumerate(self.engines)]
            self.faults.inject("kill_engine", actor=self.engines[0])
        return pending

    def _wave_call(self, wave, params):
        p, s = wave
        chunk = -(-len(p) // len(self.engines))

        def submit(i, engine):
            return engine.generate.remote(p[i * chunk : (i + 1) * chunk], s[i * chunk : (i + 1) * chunk], params)
        return submit

    def collect(self, pending: "PendingRollout") -> list:
        """The samples of a submitted rollout, in order (an engine that died is restarted with the version the rollout
        was submitted under and its call repeated). `pending.waited_s`: how long the driver waited here."""
        t0 = time.perf_counter()
        out = []
        with RolloutProgress(pending.total, self._engine_progress) as shown:
            for k, wave in enumerate(pending.waves):
                refs = pending.first if k == 0 else None
                out += [x for part in self._on_engines(self._wave_call(wave, pending.params), "rollout",
                                                       fault="kill_engine", poll=shown.poll, refs=refs)
                        for x in part]
                shown.wave_done(len(wave[0]), sum(len(x.response_ids) for x in out))
        pending.waited_s = time.perf_counter() - t0
        return out

    def generate_seconds(self) -> float:
        """The engines' generate seconds since the last ask: the slowest engine's (rollout.policy_lag's overlap)."""
        return max(self._on_engines(lambda i, e: e.generate_seconds.remote(), "generate timing"), default=0.0)

    def _engine_progress(self) -> list[dict | None]:
        """Each engine's rollout in flight (samples and tokens done), asked beside its generate call."""
        return ray.get([e.progress.remote() for e in self.engines], timeout=10)

    def rollout_metrics(self) -> dict:
        """The engines' own rollout timings and server peaks (SGLang: generation, re-score, running requests, KV-pool
        use): the slowest engine's seconds and the peaks' maximum."""
        merged: dict = {}
        for m in self._on_engines(lambda i, e: e.rollout_metrics.remote(), "rollout metrics"):
            for k, v in m.items():
                merged[k] = max(merged.get(k, v), v)
        return merged

    def release_engine_memory(self) -> None:
        """cluster.gpu_handoff: every server gives its GPU memory back before the trainer steps."""
        self._on_engines(lambda i, e: e.release_memory.remote(), "memory release")

    def resume_engine_memory(self) -> None:
        """... and takes it back before the weight push (which restores its weights)."""
        self._on_engines(lambda i, e: e.resume_memory.remote(), "memory resume")

    def push_weights(self, only: list[int] | None = None, connect: bool = False, version: int | None = None) -> None:
        """Trainer rank 0 sends weight version `version` (default: the next) to the engines (all, or `only`: they get
        the version the others hold); the driver holds none of it. Rank 0 sends its live weights, or its copy of an
        older version (top_rl.train.snapshots: a lagged run's resume, a restart while the trainer is one version
        ahead). `connect`: rank 0 connects to those engines first (at start, after a restart), in the same
        submission: rank 0 runs its calls in order. An engine that died meanwhile is restarted (and sent the weights
        itself)."""
        indices = list(range(len(self.engines))) if only is None else only
        if only is None:
            self.weight_version = self.weight_version + 1 if version is None else version
        setup, names = [], []
        for i in indices if connect else []:
            refs, who = self._connect(i)
            setup, names = setup + refs, names + who
        args = (indices, self.weight_version, WEIGHT_BUCKET_BYTES)
        pushes = [t.push_weights.remote(*args) for t in self.trainers]
        self._get(setup, names, "weight group setup")
        results = self._get(pushes, [f"trainer rank {r}" for r in range(len(pushes))], "weight push")[0]
        for i, error in results:
            if error is not None:
                self._replace_engine(i, f"rollout engine {i} failed to take weights: {error}", "weight push")

    # ---------------------------------------------------------------- trainer ranks
    def _on_trainers(self, method: str, args_per_rank, what: str, fault: str | None = None) -> list:
        refs = [getattr(t, method).remote(*args) for t, args in zip(self.trainers, args_per_rank)]
        if fault:
            self.faults.inject(fault, actor=self.trainers[0])
        return self._get(refs, [f"trainer rank {r}" for r in range(len(refs))], what)

    def rl_step(self, batch):
        """The RL step on every rank (top_rl.train.rl_step); rank 0's StepReport."""
        ref = ray.put(batch)  # one copy for all ranks
        return self._on_trainers("rl_step", [(ref,)] * len(self.trainers), "trainer.rl_step", fault="kill_trainer")[0]

    def kernel_reports(self) -> list[dict]:
        """Every actor's kernels.report() (trainer ranks, then engines): the paths its ops took, its fallbacks."""
        return (self._on_trainers("kernel_report", [()] * len(self.trainers), "kernel report")
                + self._on_engines(lambda i, e: e.kernel_report.remote(), "kernel report"))

    def save_trainer_states(self, paths: list[str]) -> None:
        """Every rank writes its part of the trainer's state (top_rl.run.dist_state) into its path, the
        checkpoint's trainer/ directory: no state via the driver."""
        self._on_trainers("save_checkpoint", [(p,) for p in paths], "checkpoint save")

    def load_trainer_states(self, paths: list[str], version: int) -> None:
        """Each rank loads its part of the state from its path (trainer/, or its own trainer_rankNNN.pt of a
        checkpoint before format 3); `version`: the weight version of its weights (the step's + 1), which a shard
        that records its own must agree with."""
        if len(paths) != len(self.trainers):
            raise ValueError(f"checkpoint has {len(paths)} trainer shards, this run has {len(self.trainers)} ranks")
        self._on_trainers("load_checkpoint", [(p, version) for p in paths], "checkpoint load")

    def save_hf(self, path: str) -> None:
        """The policy as an HF checkpoint, written by trainer rank 0."""
        self._on_trainers("save_hf", [(path,)] * len(self.trainers), "HF export")

    def shutdown(self) -> None:
        for e in self.engines:
            try:
                ray.get(e.shutdown.remote(), timeout=60)  # longer than a server stop's 30 s grace
            except Exception:  # noqa: BLE001 - best effort on the way out (the engine may be dead)
                pass
        for actor in self.engines + self.trainers:  # a rank whose peer died may be blocked in a collective
            ray.kill(actor, no_restart=True)
        remove_placement_group(self.pg)
