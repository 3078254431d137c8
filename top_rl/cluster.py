"""Ray placement and actors: rollout engines and trainer ranks, driven by the loop on the driver.

Locally this is `ray.init()` with the machine's CPUs; on a cluster (`cluster.address` or RAY_ADDRESS) it
joins the running Ray. One placement group holds a bundle per engine and per trainer rank. Trainer ranks
are SPMD: every call goes to every rank with the same arguments and rank 0's answer is returned. A dead
actor surfaces as `ActorFailed` naming it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import ray
import torch
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


@dataclass
class ClusterConfig:
    address: str | None = None  # None: RAY_ADDRESS if set, else a local Ray on this machine
    num_cpus: int | None = None  # local Ray only; None = all cores
    engine_cpus: float = 1.0
    trainer_cpus: float = 1.0
    engine_gpus: float = 0.0
    trainer_gpus: float = 0.0
    torch_threads: int = 0  # per actor; 0 = the machine's cores (rollout and training alternate)


class ActorFailed(RuntimeError):
    pass


def _threads(cfg: ClusterConfig) -> int:
    return cfg.torch_threads or os.cpu_count() or 1


@ray.remote
class EngineActor:
    """Hosts one rollout engine (native in-process, or an SGLang server it launches)."""

    def __init__(self, kind: str, kernel_backend: str, threads: int, hf_config: dict, hf_weights: dict,
                 dtype: str, logprob_source: str, sglang: dict | None = None):
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

            self.engine = SglangEngine.from_config(sglang or {}, logprob_source=logprob_source)
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

        kernels.set_backend(kernel_backend)
        init_process_group(rank, world, init_method if world > 1 else None)
        self.trainer = Trainer(Qwen3Config(**qwen3_config), trainer_cfg)

    def call(self, method: str, *args):
        return getattr(self.trainer, method)(*args)

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
                 initial_weights: dict):
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
        hf_config = qwen3_cfg.to_hf_dict()
        weights_ref = ray.put(initial_weights)
        self.engines = [
            EngineActor.options(scheduling_strategy=self._bundle(i), num_cpus=0).remote(
                rollout_cfg.engine, kernel_backend, threads, hf_config, weights_ref, trainer_cfg.dtype,
                rollout_cfg.logprob_source, rollout_cfg.sglang)
            for i in range(rollout_cfg.num_engines)
        ]
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        qcfg = dict(qwen3_cfg.__dict__)
        self.trainers = [
            TrainerActor.options(scheduling_strategy=self._bundle(rollout_cfg.num_engines + r), num_cpus=0).remote(
                r, world, init_method, kernel_backend, threads, qcfg, trainer_cfg)
            for r in range(world)
        ]
        self.trainer_call("load_hf", weights_ref)

    def _bundle(self, index: int):
        return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=index)

    def _get(self, refs, what: str):
        try:
            return ray.get(refs)
        except (RayActorError, RayTaskError) as e:
            raise ActorFailed(f"{what} failed: {e}") from e

    def generate(self, prompts, seeds, params):
        """Split samples over engines contiguously; a sample's result does not depend on its engine."""
        n = len(self.engines)
        chunk = -(-len(prompts) // n)
        refs = [e.generate.remote(prompts[i * chunk : (i + 1) * chunk], seeds[i * chunk : (i + 1) * chunk], params)
                for i, e in enumerate(self.engines)]
        return [s for part in self._get(refs, "rollout engine") for s in part]

    def trainer_call(self, method: str, *args):
        return self._get([t.call.remote(method, *args) for t in self.trainers], f"trainer.{method}")[0]

    def train_step(self, batch, loss_fn):
        return self._get([t.train_step.remote(batch, loss_fn) for t in self.trainers], "trainer.train_step")[0]

    def trainer_states(self) -> list:
        return self._get([t.call.remote("state_dict") for t in self.trainers], "trainer.state_dict")

    def load_trainer_states(self, shards: list) -> None:
        if len(shards) != len(self.trainers):
            raise ValueError(f"checkpoint has {len(shards)} trainer shards, this run has {len(self.trainers)} ranks")
        self._get([t.call.remote("load_state_dict", s) for t, s in zip(self.trainers, shards)], "trainer.load_state_dict")

    def sync_weights(self) -> None:
        ref = ray.put(self.trainer_call("export_hf_weights"))
        self._get([e.update_weights.remote(ref) for e in self.engines], "engine weight update")

    def shutdown(self) -> None:
        for e in self.engines:
            try:
                ray.get(e.shutdown.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        remove_placement_group(self.pg)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
