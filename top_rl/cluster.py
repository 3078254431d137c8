"""Ray placement and actors: rollout engines and trainer ranks, driven by the loop on the driver.

Locally this is `ray.init()` with the machine's CPUs; on a cluster (`cluster.address` or RAY_ADDRESS) it
joins the running Ray. One placement group holds a bundle per engine and per trainer rank. Trainer ranks
are SPMD: every call goes to every rank with the same arguments and rank 0's answer is returned.

Faults (top_rl.faults): results are awaited fail-fast, so the first actor that dies or raises surfaces
as `ActorFailed` naming it, without waiting on its SPMD peers (which may be blocked in a collective with
it). A rollout engine that dies is replaced in its bundle by a fresh one holding the current weights,
and the call is repeated (at most `cluster.max_engine_restarts` times per run): a rollout is a pure
function of prompts, seeds and weights, so the repeat returns what the lost call would have.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass

import ray
import torch
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from tqdm import tqdm

from top_rl import faults
from top_rl.faults import ActorFailed


@dataclass
class ClusterConfig:
    address: str | None = None  # None: RAY_ADDRESS if set, else a local Ray on this machine
    num_cpus: int | None = None  # local Ray only; None = all cores
    engine_cpus: float = 1.0
    trainer_cpus: float = 1.0
    engine_gpus: float = 0.0
    trainer_gpus: float = 0.0
    torch_threads: int = 0  # per actor; 0 = the machine's cores (rollout and training alternate)
    max_engine_restarts: int = 3  # rollout engines that die are replaced this many times per run
    # Samples per engine call; a step's rollout is sent in waves of this size per engine so the progress
    # bar moves. 0: one call per engine. Batch invariance makes the samples the same either way.
    rollout_chunk: int = 0


def _threads(cfg: ClusterConfig) -> int:
    return cfg.torch_threads or os.cpu_count() or 1


@ray.remote
class EngineActor:
    """Hosts one rollout engine (native in-process, or an SGLang server it launches)."""

    def __init__(self, kind: str, kernel_backend: str, threads: int, hf_config: dict, hf_weights: dict,
                 dtype: str, logprob_source: str, sglang: dict | None = None):
        """`sglang`: for kind "sglang", the keyword arguments of SglangEngine.from_config (the run's
        rollout.sglang mapping plus the trainer's attention backend, model path, TOP switch, engine index)."""
        torch.set_num_threads(threads)
        from top_rl import kernels

        kernels.set_backend(kernel_backend)
        if kind == "native":
            from top_rl.model import Qwen3, Qwen3Config, load_hf_state_dict
            from top_rl.rollout.native import NativeEngine

            model = Qwen3(Qwen3Config.from_hf_dict(hf_config), dtype)
            load_hf_state_dict(model, hf_weights, source="initial weights")
            self.engine = NativeEngine(model, logprob_source)
        elif kind == "sglang":
            from top_rl.rollout.sglang import SglangEngine

            self.engine = SglangEngine.from_config(logprob_source=logprob_source, **(sglang or {}))
        else:
            raise ValueError(f"rollout.engine={kind!r}; choose native or sglang")

    def generate(self, prompts, seeds, params):
        return self.engine.generate(prompts, seeds, params)

    def update_weights(self, hf_weights):
        self.engine.update_weights(hf_weights)

    def health(self):
        return self.engine.health()

    def shutdown(self):
        self.engine.shutdown()


@ray.remote
class TrainerActor:
    """One trainer rank (Megatron-core over the kernel seam)."""

    def __init__(self, rank: int, world: int, init_method: str, kernel_backend: str, threads: int,
                 qwen3_config: dict, trainer_cfg):
        torch.set_num_threads(threads)
        from top_rl import kernels
        from top_rl.model import Qwen3Config
        from top_rl.train import Trainer
        from top_rl.train.parallel import init_process_group

        from top_rl.checkpoint import seed_process

        kernels.set_backend(kernel_backend)
        seed_process(trainer_cfg.seed)  # every RNG this rank checkpoints starts from a known state
        init_process_group(rank, world, init_method if world > 1 else None)
        self.trainer = Trainer(Qwen3Config(**qwen3_config), trainer_cfg)

    def call(self, method: str, *args):
        return getattr(self.trainer, method)(*args)

    def save_checkpoint(self, path: str) -> None:
        """This rank's shard, written by the rank itself (run_dir must be on storage every node sees)."""
        from top_rl.checkpoint import rng_state

        torch.save({"trainer": self.trainer.state_dict(), "rng": rng_state()}, path)

    def load_checkpoint(self, path: str) -> None:
        from top_rl.checkpoint import set_rng_state

        state = torch.load(path, weights_only=False)
        self.trainer.load_state_dict(state["trainer"])
        set_rng_state(state["rng"])

    def train_step(self, batch, loss_fn):
        """train_step whose loss_fn returns (loss, metrics): metrics come back sample-weighted."""
        seen: list[tuple[int, dict]] = []

        def scalar_loss(lps, idx):
            loss, metrics = loss_fn(lps, idx)
            seen.append((len(idx), metrics))
            return loss

        out = self.trainer.train_step(batch, scalar_loss)
        total = sum(n for n, _ in seen) or 1
        for key in {k for _, m in seen for k in m}:
            out[f"loss/{key}"] = sum(n * m.get(key, 0.0) for n, m in seen) / total
        return out


class Cluster:
    def __init__(self, cfg: ClusterConfig, kernel_backend: str, rollout_cfg, trainer_cfg, qwen3_cfg,
                 initial_weights: dict, sglang_context: dict | None = None):
        """`sglang_context`: run-level settings SGLang engines are checked against (attention backend of
        the trainer, model path, TOP on/off); unused by the native engine."""
        if not ray.is_initialized():
            address = cfg.address or os.environ.get("RAY_ADDRESS")
            if address:
                ray.init(address=address, log_to_driver=True)
            else:
                ray.init(num_cpus=cfg.num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=True,
                         configure_logging=False)
        world = trainer_cfg.tp * trainer_cfg.pp * trainer_cfg.cp
        bundles = [{"CPU": cfg.engine_cpus, **({"GPU": cfg.engine_gpus} if cfg.engine_gpus else {})}] * (
            rollout_cfg.num_engines
        ) + [{"CPU": cfg.trainer_cpus, **({"GPU": cfg.trainer_gpus} if cfg.trainer_gpus else {})}] * world
        self.pg = placement_group(bundles, strategy="PACK")
        ray.get(self.pg.ready(), timeout=120)
        threads = _threads(cfg)
        self.qwen3_cfg, self.compute_dtype = qwen3_cfg, trainer_cfg.dtype
        self.restarts_left, self.max_restarts = cfg.max_engine_restarts, cfg.max_engine_restarts
        self.rollout_chunk = cfg.rollout_chunk
        # The policy the engines hold (and a restarted engine must get): initial, then each sync's.
        self._weights_ref = ray.put(initial_weights)
        self._engine_args = (rollout_cfg.engine, kernel_backend, threads, qwen3_cfg.to_hf_dict())
        self._engine_kwargs = dict(dtype=trainer_cfg.dtype, logprob_source=rollout_cfg.logprob_source)
        self._sglang = dict(sglang=rollout_cfg.sglang, **(sglang_context or {}))
        self.engines = [self._new_engine(i) for i in range(rollout_cfg.num_engines)]
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        qcfg = dict(qwen3_cfg.__dict__)
        self.trainers = [
            TrainerActor.options(scheduling_strategy=self._bundle(rollout_cfg.num_engines + r), num_cpus=0).remote(
                r, world, init_method, kernel_backend, threads, qcfg, trainer_cfg)
            for r in range(world)
        ]
        self.trainer_call("load_hf", self._weights_ref)

    def _bundle(self, index: int):
        return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=index)

    def _new_engine(self, i: int):
        return EngineActor.options(scheduling_strategy=self._bundle(i), num_cpus=0).remote(
            *self._engine_args, hf_weights=self._weights_ref, **self._engine_kwargs,
            sglang={**self._sglang, "index": i})

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
                faults.inject(fault, actor=self.engines[0])
            try:
                return self._get(refs, [f"rollout engine {i}" for i in range(len(refs))], what)
            except ActorFailed as e:
                if not e.died:
                    raise
                self._replace_engine(e, what)

    def _replace_engine(self, failure: ActorFailed, what: str) -> None:
        if self.restarts_left <= 0:
            raise ActorFailed(f"{failure}\nNo engine restarts left (cluster.max_engine_restarts={self.max_restarts}).",
                              failure.actor, True, failure.index) from failure
        self.restarts_left -= 1
        print(f"[top-rl] {failure}\n[top-rl] restarting {failure.actor} with the current weights and repeating the "
              f"{what} (restart {self.max_restarts - self.restarts_left} of {self.max_restarts})", flush=True)
        ray.kill(self.engines[failure.index], no_restart=True)  # it may only be unreachable
        engine = self._new_engine(failure.index)
        # The native engine loaded the weights in its constructor; an SGLang engine starts from model.path.
        self._get([engine.update_weights.remote(self._weights_ref)], [failure.actor], "restart")
        self.engines[failure.index] = engine

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

    def sync_weights(self) -> None:
        self._weights_ref = ray.put(self.trainer_call("export_hf_weights"))
        self._on_engines(lambda i, e: e.update_weights.remote(self._weights_ref), "engine weight update")

    def policy_weights(self) -> dict:
        """HF-named weights the engines sample with: the trainer's after its last `sync_weights`."""
        return ray.get(self._weights_ref)

    # ---------------------------------------------------------------- trainer ranks
    def _on_trainers(self, method: str, args_per_rank, what: str, fault: str | None = None) -> list:
        refs = [getattr(t, method).remote(*args) for t, args in zip(self.trainers, args_per_rank)]
        if fault:
            faults.inject(fault, actor=self.trainers[0])
        return self._get(refs, [f"trainer rank {r}" for r in range(len(refs))], what)

    def trainer_call(self, method: str, *args):
        return self._on_trainers("call", [(method, *args)] * len(self.trainers), f"trainer.{method}")[0]

    def train_step(self, batch, loss_fn):
        return self._on_trainers("train_step", [(batch, loss_fn)] * len(self.trainers), "trainer.train_step",
                                 fault="kill_trainer")[0]

    def save_trainer_states(self, paths: list[str]) -> None:
        """Each rank writes its shard (Trainer.state_dict() and its RNG) to its path: no state via the driver."""
        self._on_trainers("save_checkpoint", [(p,) for p in paths], "checkpoint save")

    def load_trainer_states(self, paths: list[str]) -> None:
        if len(paths) != len(self.trainers):
            raise ValueError(f"checkpoint has {len(paths)} trainer shards, this run has {len(self.trainers)} ranks")
        self._on_trainers("load_checkpoint", [(p,) for p in paths], "checkpoint load")

    def shutdown(self) -> None:
        for e in self.engines:
            try:
                ray.get(e.shutdown.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - best effort on the way out (the engine may be dead)
                pass
        for actor in self.engines + self.trainers:  # a rank whose peer died may be blocked in a collective
            ray.kill(actor, no_restart=True)
        remove_placement_group(self.pg)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
