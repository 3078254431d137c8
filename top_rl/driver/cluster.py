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
import sys

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from tqdm import tqdm

from top_rl.run import fault_injection, faults
from top_rl.driver import local_ray
from top_rl.driver import placement
from top_rl.driver import rendezvous
from top_rl.weights import sync as weight_sync
from top_rl.driver.actors import EngineActor, TrainerActor
from top_rl.run.stopped import ActorFailed
from top_rl.driver.placement import ClusterConfig, PlacementError
from top_rl.kernels.plan import KernelPlan

WEIGHT_BUCKET_BYTES = 512 << 20


def _threads(cfg: ClusterConfig) -> int:
    return cfg.torch_threads or os.cpu_count() or 1


def start_ray(cfg: ClusterConfig) -> None:
    if ray.is_initialized():
        return
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    if address:  # a cluster's workers do not inherit this process's warning filters: install them there too
        ray.init(address=address, log_to_driver=True,
                 runtime_env={"worker_process_setup_hook": "top_rl.observe.quiet.install"})
    else:  # a local run: every server Ray starts listens on loopback only (top_rl.driver.rendezvous)
        rendezvous.ray_on_loopback()
        local_ray.start(num_cpus=cfg.num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=True,
                        configure_logging=False)  # its processes survive a group SIGTERM/SIGHUP (top_rl.driver.local_ray)
        faults.raise_if_interrupted()  # a stop signal that came while Ray started: stop before placing actors


class Cluster:
    def __init__(self, cfg: ClusterConfig, *, kernel_plan: KernelPlan, rollout_cfg, trainer_cfg,
                 step_cfg, model_cfg, arch, vocab_size: int, eos_token_id: int | None,
                 sglang_context: dict | None = None):
        """`sglang_context`: run-level settings SGLang engines are checked against (attention backend of the
        trainer, model path, TOP on/off) and `initial_policy`, where a run without a model path writes the servers'
        starting checkpoint; unused by the native engine. `kernel_plan`: the run's kernels, which every actor installs
        (trainer ranks, native engines); SGLang servers launch with its contract and are checked against its
        attention kernel."""
        start_ray(cfg)
        world = trainer_cfg.dp * trainer_cfg.tp * trainer_cfg.pp * trainer_cfg.cp
        self.plan = placement.plan(rollout_cfg.num_engines, world, cfg)
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
        threads = _threads(cfg)
        self.cfg, self.arch, self.compute_dtype = cfg, arch, trainer_cfg.dtype
        self.restarts_left, self.max_restarts = cfg.max_engine_restarts, cfg.max_engine_restarts
        self.rollout_chunk = cfg.rollout_chunk
        self.weight_version = 0
        self.is_sglang = rollout_cfg.engine == "sglang"

        self.trainers = [
            TrainerActor.options(scheduling_strategy=self._bundle(self.plan.trainer_bundle[r]), num_cpus=0,
                                 num_gpus=self.plan.trainer_gpus).remote(r, world, kernel_plan, threads)
            for r in range(world)
        ]
        host, port = ray.get(self.trainers[0].free_address.remote())
        self._on_trainers("setup", [((host, port), arch, trainer_cfg, step_cfg, model_cfg,
                                     vocab_size, eos_token_id)] * world, "trainer setup")
        self.trainer_endpoint = ray.get(self.trainers[0].endpoint.remote())

        self._engine_args = (rollout_cfg.engine, kernel_plan, threads, arch)
        self._engine_kwargs = dict(dtype=trainer_cfg.dtype, logprob_source=rollout_cfg.logprob_source)
        context = dict(sglang_context or {})
        initial_policy = context.pop("initial_policy", None)
        self._sglang = dict(sglang=rollout_cfg.sglang, trainer_attention_backend=kernel_plan.attention, **context)
        if self.is_sglang and not self._sglang.get("model_path"):
            # A server starts from a checkpoint on disk: the run's random initial policy, written by trainer rank 0
            # (the servers get the trainer's weights again by the first push, like every later version).
            if not initial_policy:
                raise ValueError("rollout.engine=sglang without model.path needs sglang_context['initial_policy']")
            self.save_hf(initial_policy)
            self._sglang["model_path"] = initial_policy
        self.engines = [self._new_engine(i) for i in range(rollout_cfg.num_engines)]
        self.transports = [self._connect(i) for i in range(len(self.engines))]
        self.push_weights()

    def _bundle(self, index: int):
        return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=index)

    def _new_engine(self, i: int):
        return EngineActor.options(scheduling_strategy=self._bundle(self.plan.engine_bundle[i]), num_cpus=0,
                                   num_gpus=self.plan.engine_gpus).remote(
            *self._engine_args, **self._engine_kwargs, sglang={**self._sglang, "index": i})

    def _connect(self, i: int) -> str:
        """Engine i's weight transport; a broadcast group is opened by rank 0 and joined by the engine."""
        if self.is_sglang:
            if (self._sglang["sglang"] or {}).get("weight_sync", "disk") != "distributed":
                return "object_store"  # the engine actor writes / serialises for its server (disk, tensor)
            host, port = ray.get(self.trainers[0].free_address.remote())
            backend = "nccl" if self.trainer_endpoint.gpu else "gloo"
            tp = int((self._sglang["sglang"] or {}).get("tp_size", 1))
            name = f"top_rl_sglang_{i}_{port}"
            self._get([self.trainers[0].open_sglang_group.remote(i, host, port, 1 + tp, name, backend),
                       self.engines[i].sglang_join_group.remote(host, port, backend, name)],
                      ["trainer rank 0", f"rollout engine {i}"], "weight group setup")
            flat = ray.get(self.engines[i].sglang_flattened.remote())
            return "sglang_distributed_flat" if flat else "sglang_distributed"
        endpoint = self._get([self.engines[i].endpoint.remote()], [f"rollout engine {i}"], "start")[0]
        transport = weight_sync.choose(self.cfg.weight_transport, self.trainer_endpoint, endpoint)
        if transport == "broadcast":
            host, port = ray.get(self.trainers[0].free_address.remote())
            name = f"top_rl_weights_{i}_{port}"
            self._get([self.trainers[0].open_group.remote(i, host, port, name),
                       self.engines[i].join_group.remote(host, port, name)],
                      ["trainer rank 0", f"rollout engine {i}"], "weight group setup")
        return transport

    def _get(self, refs, names: list[str], what: str) -> list:
        """ray.get, fail-fast: the first actor that dies or raises ends the wait (see module doc)."""
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
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
    def _on_engines(self, submit, what: str, fault: str | None = None) -> list:
        """`submit(i, engine) -> ref` on every engine; a dead engine is replaced and the call repeated."""
        while True:
            refs = [submit(i, e) for i, e in enumerate(self.engines)]
            if fault:
                fault_injection.inject(fault, actor=self.engines[0])
            try:
                return self._get(refs, [f"rollout engine {i}" for i in range(len(refs))], what)
            except ActorFailed as e:
                if not e.died:
                    raise
                self._replace_engine(e.index, str(e), what)

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
        self.transports[i] = self._connect(i)
        self.push_weights([i])

    def generate(self, prompts, seeds, params):
        """Split samples over engines (in waves of cluster.rollout_chunk per engine); a sample's result
        depends only on its prompt, seed and the weights, never on its engine or batch."""
        n_eng = len(self.engines)
        wave = self.rollout_chunk * n_eng if self.rollout_chunk > 0 else len(prompts)
        out = []
        with tqdm(total=len(prompts), desc="rollout", unit="sample", leave=False,
                  disable=not sys.stderr.isatty()) as bar:
            for w in range(0, len(prompts), wave):
                p, s = prompts[w : w + wave], seeds[w : w + wave]
                chunk = -(-len(p) // n_eng)

                def submit(i, engine, p=p, s=s, chunk=chunk):
                    return engine.generate.remote(p[i * chunk : (i + 1) * chunk], s[i * chunk : (i + 1) * chunk], params)

                out += [x for part in self._on_engines(submit, "rollout", fault="kill_engine") for x in part]
                bar.update(len(p))
        return out

    def push_weights(self, only: list[int] | None = None) -> None:
        """Trainer rank 0 sends the current policy to the engines (all, or `only`); the driver holds none of it.
        An engine that died meanwhile is restarted (and sent the weights itself)."""
        indices = list(range(len(self.engines))) if only is None else only
        if only is None:
            self.weight_version += 1
        args = ([self.engines[i] for i in indices], indices, [self.transports[i] for i in indices],
                self.weight_version, WEIGHT_BUCKET_BYTES)
        results = self._on_trainers("push_weights", [args] * len(self.trainers), "weight push")[0]
        for i, error in results:
            if error is not None:
                self._replace_engine(i, f"rollout engine {i} failed to take weights: {error}", "weight push")

    # ---------------------------------------------------------------- trainer ranks
    def _on_trainers(self, method: str, args_per_rank, what: str, fault: str | None = None) -> list:
        refs = [getattr(t, method).remote(*args) for t, args in zip(self.trainers, args_per_rank)]
        if fault:
            fault_injection.inject(fault, actor=self.trainers[0])
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
        """Each rank writes its shard (Trainer.state_dict() and its RNG) to its path: no state via the driver."""
        self._on_trainers("save_checkpoint", [(p,) for p in paths], "checkpoint save")

    def load_trainer_states(self, paths: list[str]) -> None:
        if len(paths) != len(self.trainers):
            raise ValueError(f"checkpoint has {len(paths)} trainer shards, this run has {len(self.trainers)} ranks")
        self._on_trainers("load_checkpoint", [(p,) for p in paths], "checkpoint load")

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
