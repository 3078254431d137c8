"""Where each Ray actor runs: the cluster settings, and a pure plan (no Ray) checked against the resources a
cluster has (before Ray starts on a local run; against `ray.cluster_resources()` on a running cluster).

Two layouts, chosen by `cluster.colocate`:
  separate   one placement-group bundle per engine ({CPU: engine_cpus, GPU: engine_gpus}) and per trainer
             rank ({CPU: trainer_cpus, GPU: trainer_gpus}); each actor asks for its bundle's GPUs, so Ray
             gives it its own device(s) (CUDA_VISIBLE_DEVICES).
  colocated  one bundle per trainer rank holding one whole GPU that the rank shares with engines
             (fractional GPUs: trainer_gpus + engines x engine_gpus <= 1). Engines fill the ranks' GPUs
             from the last rank down, so with fewer engines than ranks no engine shares rank 0's GPU and
             the trainer can broadcast to every engine over NCCL (top_rl.weights.transport).
Bundle order: engines first (separate) then ranks; `engine_bundle` / `trainer_bundle` index into it.
"""

from __future__ import annotations

from dataclasses import dataclass

from top_rl.config.cluster import ClusterConfig  # noqa: F401 - also placement.ClusterConfig


class PlacementError(ValueError):
    pass


@dataclass(frozen=True)
class Placement:
    bundles: list[dict[str, float]]
    engine_bundle: list[int]
    trainer_bundle: list[int]
    engine_gpus: float  # what each engine actor asks for
    trainer_gpus: float

    def total(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for b in self.bundles:
            for k, v in b.items():
                out[k] = out.get(k, 0.0) + v
        return out

    def describe(self) -> str:
        t = self.total()
        return (f"{len(self.engine_bundle)} engine(s) x {self.engine_gpus:g} GPU, {len(self.trainer_bundle)} trainer "
                f"rank(s) x {self.trainer_gpus:g} GPU in {len(self.bundles)} bundle(s): "
                + ", ".join(f"{v:g} {k}" for k, v in sorted(t.items())))


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    return {"CPU": cpus, **({"GPU": gpus} if gpus else {})}


def plan(num_engines: int, world: int, cfg) -> Placement:
    """`cfg`: the run's ClusterConfig (engine_cpus/gpus, trainer_cpus/gpus, colocate)."""
    if not cfg.colocate:
        bundles = [_bundle(cfg.engine_cpus, cfg.engine_gpus)] * num_engines + \
                  [_bundle(cfg.trainer_cpus, cfg.trainer_gpus)] * world
        return Placement(bundles, list(range(num_engines)), list(range(num_engines, num_engines + world)),
                         cfg.engine_gpus, cfg.trainer_gpus)
    if not (0 < cfg.trainer_gpus < 1 and 0 < cfg.engine_gpus < 1):
        raise PlacementError(f"cluster.colocate=true shares each trainer rank's GPU with engines: set fractional "
                             f"cluster.trainer_gpus and cluster.engine_gpus (got {cfg.trainer_gpus:g} and "
                             f"{cfg.engine_gpus:g}), e.g. 0.5 and 0.5")
    per_gpu = -(-num_engines // world)
    if cfg.trainer_gpus + per_gpu * cfg.engine_gpus > 1 + 1e-9:
        raise PlacementError(f"cluster.colocate=true: {num_engines} engine(s) on {world} GPU(s) put {per_gpu} on one "
                             f"GPU: trainer_gpus {cfg.trainer_gpus:g} + {per_gpu} x engine_gpus {cfg.engine_gpus:g} > 1")
    engine_bundle = [world - 1 - (i % world) for i in range(num_engines)]
    cpus = [cfg.trainer_cpus + cfg.engine_cpus * engine_bundle.count(r) for r in range(world)]
    return Placement([_bundle(c, 1.0) for c in cpus], engine_bundle, list(range(world)), cfg.engine_gpus,
                     cfg.trainer_gpus)


def check(placement: Placement, have: dict[str, float], where: str, hint: str = "") -> None:
    """Refuse a placement the cluster cannot hold, naming what was asked and what there is. `hint`: the trainer
    layouts the model allows (top_rl.train.layout_rules.hint), so the advice never names one it refuses."""
    want = placement.total()
    short = [k for k, v in want.items() if v > have.get(k, 0.0) + 1e-9]
    if short:
        have_s = ", ".join(f"{have.get(k, 0.0):g} {k}" for k in sorted(want))
        raise PlacementError(f"the run asks for {placement.describe()}; {where} has {have_s}. Lower "
                             "rollout.num_engines / trainer.{dp,tp,pp,cp}" + (f" ({hint})" if hint else "")
                             + ", the cluster.*_gpus / *_cpus per actor, or share GPUs (cluster.colocate=true); on a "
                             "local run cluster.num_cpus raises Ray's CPU count")
    if "GPU" in want:  # a bundle must fit on one node: no single GPU bundle can exceed a node's GPUs
        biggest = max(b.get("GPU", 0.0) for b in placement.bundles)
        if biggest > have.get("GPU", 0.0) + 1e-9:
            raise PlacementError(f"a bundle asks for {biggest:g} GPU; {where} has {have.get('GPU', 0.0):g}")


def local_resources(num_cpus: int | None) -> dict[str, float]:
    """What `ray.init()` on this machine will offer, without starting Ray."""
    import os

    import torch

    return {"CPU": float(num_cpus or os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}


def check_before_start(num_engines: int, trainer_cfg, cfg: ClusterConfig, hint: str = "",
                       on_cluster: bool = False) -> Placement:
    """The run's plan; on a local run (`on_cluster` false: top_rl.driver.resolution decides), refused before Ray
    starts if this machine cannot hold it. On a running cluster the check runs against its resources once connected."""
    world = trainer_cfg.world
    p = plan(num_engines, world, cfg)
    if not on_cluster:
        check(p, local_resources(cfg.num_cpus), "this machine", hint)
    return p
