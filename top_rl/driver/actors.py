"""The Ray actors: a rollout engine, and one trainer rank. The driver (top_rl.driver.cluster) places and calls them.

Devices: an actor computes on the GPU(s) Ray gave it (`ray.get_gpu_ids()`, exposed as CUDA_VISIBLE_DEVICES);
an actor Ray gave no GPU computes on the CPU, even on a GPU node (Ray leaves CUDA_VISIBLE_DEVICES unset for
it, so without this it would silently share GPU 0 with everyone).
Weights: engines start empty and are sent every version by trainer rank 0 (top_rl.weights.sync); the driver
never holds them.
"""

from __future__ import annotations

import os

import ray
import torch

from top_rl import kernels
from top_rl.driver import rendezvous
from top_rl.kernels.plan import KernelPlan
from top_rl.weights import sync as weight_sync
from top_rl.weights.sync import Endpoint


def _setup_process(kernel_plan: KernelPlan, threads: int) -> None:
    """Every actor, before its first kernel: the run's KernelPlan (an argument, so Ray carries it to any node)."""
    from top_rl.observe import quiet

    quiet.install()  # third-party start-up notices, once per actor (top_rl/observe/quiet.py)
    rendezvous.bind_gloo(ray.util.get_node_ip_address())  # before any gloo group: the node's address only
    if not ray.get_gpu_ids():
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before anything initialises CUDA in this process
    torch.set_num_threads(threads)
    kernels.install(kernel_plan)  # backend, contract (the engines' GEMM path), attention kernel, fast paths


def _device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


@ray.remote
class EngineActor:
    """Hosts one rollout engine: native (in-process over the kernel seam) or an SGLang server it launches."""

    def __init__(self, kind: str, kernel_plan: KernelPlan, threads: int, arch, dtype: str, logprob_source: str,
                 sglang: dict | None = None):
        """`sglang`: for kind "sglang", the keyword arguments of SglangEngine.from_config (the run's
        rollout.sglang mapping plus the trainer's attention backend, model path, TOP switch, engine index).
        `kernel_plan`: the run's kernels; its contract is the native engine's and the SGLang server's alike."""
        _setup_process(kernel_plan, threads)
        self.kind, self.version, self.group = kind, -1, None
        if kind == "native":
            from top_rl.model import family
            from top_rl.rollout.native import NativeEngine

            model = family.of(arch).NativeModel(arch, dtype).to(_device())  # weights: the first push
            self.engine = NativeEngine(model, logprob_source)
        elif kind == "sglang":
            from top_rl.rollout.sglang import SglangEngine

            self.engine = SglangEngine.from_config(logprob_source=logprob_source, contract_name=kernel_plan.contract,
                                                   **(sglang or {}))
        else:
            raise ValueError(f"rollout.engine={kind!r}; choose native or sglang")

    def endpoint(self) -> Endpoint:
        return Endpoint.here()

    def kernel_report(self) -> dict:
        return kernels.report()

    def generate(self, prompts, seeds, params):
        return self.engine.generate(prompts, seeds, params)

    # weights, by transport (top_rl.weights.sync)
    def load_weights(self, hf_weights: dict, version: int) -> int:
        self.engine.update_weights(hf_weights)
        self.version = version
        return version

    def join_group(self, host: str, port: int, name: str) -> None:
        self.group = weight_sync.Group(host, port, 1, 2, name)

    def receive_broadcast(self, metas: list[dict], version: int) -> int:
        return self.load_weights(weight_sync.receive_broadcast(self.group, metas), version)

    def receive_ipc(self, handles: list, metas: list[dict], version: int) -> int:
        return self.load_weights(weight_sync.receive_ipc(handles, metas), version)

    # an SGLang server's own broadcast receive (rollout.sglang.weight_sync=distributed)
    def sglang_join_group(self, host: str, port: int, backend: str, name: str) -> None:
        self.engine.cfg.weight_group_name = name  # unique per engine: rank 0 holds one group per engine
        self.engine.init_weights_update_group(host, port, 1, 1 + self.engine.cfg.tp_size, backend)

    def sglang_receive_bucket(self, names, dtypes, shapes, weight_version=None):
        self.engine.update_weights_from_distributed(names, dtypes, shapes, weight_version=weight_version)
        if weight_version is not None:
            self.version = int(weight_version)

    def sglang_flattened(self) -> bool:
        return bool(self.engine.cfg.flattened_buckets)

    def health(self):
        return self.engine.health()

    def shutdown(self):
        self.engine.shutdown()


@ray.remote
class TrainerActor:
    """One trainer rank (Megatron-core over the kernel seam). Calls are SPMD: the driver sends each call to
    every rank; rank 0 answers (reports, weights it sends on)."""

    def __init__(self, rank: int, world: int, kernel_plan: KernelPlan, threads: int):
        _setup_process(kernel_plan, threads)
        self.rank, self.world = rank, world
        self.groups: dict[int, weight_sync.Group] = {}  # rank 0: engine index -> its broadcast group

    def endpoint(self) -> Endpoint:
        return Endpoint.here()

    def kernel_report(self) -> dict:
        return kernels.report()

    def free_address(self) -> tuple[str, int]:
        """An address on this node's IP for others to meet at (rank 0: the trainer's rendezvous, weight groups),
        its port reserved by this actor until the rendezvous serves on it (top_rl.driver.rendezvous)."""
        host = ray.util.get_node_ip_address()
        return host, rendezvous.reserve(host)

    def setup(self, address: tuple[str, int], arch, trainer_cfg, step_cfg, model_cfg, vocab_size: int,
              eos_token_id: int | None) -> None:
        """Join the trainer's process group (at rank 0's `address`, from its free_address), build this rank's model
        and load the initial policy: the checkpoint at model.path, or the seeded random init (every rank builds
        the same)."""
        from torch.distributed.constants import default_pg_timeout

        from top_rl.run import rng
        from top_rl.train import Trainer
        from top_rl.train.parallel import init_process_group

        rng.seed(trainer_cfg.seed)  # every RNG this rank checkpoints starts from a known state
        host, port = address
        if self.world > 1:
            init_process_group(self.rank, self.world,
                               store=rendezvous.store(host, port, self.world, self.rank, default_pg_timeout))
        else:
            rendezvous.release(port)
            init_process_group()
        self.arch = arch
        self.trainer = Trainer(arch, trainer_cfg)
        self.step_cfg = step_cfg
        if model_cfg.path:
            self.trainer.load_hf(model_cfg.path)
        else:
            self.trainer.load_hf(model_cfg.build(vocab_size, eos_token_id).hf_state_dict())

    def rl_step(self, batch):
        return self.trainer.rl_step(batch, self.step_cfg)

    # ------------------------------------------------------------------ weights to engines
    def open_group(self, index: int, host: str, port: int, name: str) -> None:
        """Rank 0: host the broadcast group with engine `index` (the engine joins concurrently)."""
        old = self.groups.pop(index, None)
        if old is not None:
            _abort(old)
        self.groups[index] = weight_sync.Group(host, port, 0, 2, name)

    def open_sglang_group(self, index: int, host: str, port: int, world: int, name: str, backend: str) -> None:
        """Rank 0: the SGLang server's weight group, made by SGLang's own helper as the server makes its end."""
        from top_rl.rollout.sglang_weights import init_trainer_group

        from torch.distributed.constants import default_pg_timeout

        store = rendezvous.store(host, port, world, 0, default_pg_timeout)  # on the reserved socket: host only
        self.groups[index] = init_trainer_group(host, port, world, name, backend, store=store)

    def push_weights(self, engines: list, indices: list[int], transports: list[str], version: int,
                     bucket_bytes: int) -> list[tuple[int, str | None]]:
        """Every rank gathers; rank 0 sends `version` to each engine by its transport. Returns, on rank 0,
        (engine index, error or None) per engine: a dead engine is the driver's to restart."""
        named = list(self.trainer.iter_hf_weights())  # collectives on every rank
        if self.rank != 0:
            return []
        bks, metas = weight_sync.plan_buckets(named, bucket_bytes)
        shared_ref, keep_alive, pending = None, [], []
        for engine, i, transport in zip(engines, indices, transports):
            if transport == "object_store":
                if shared_ref is None:
                    shared_ref = ray.put({n: t.cpu() for n, t in named})  # one copy for every such engine
                pending.append((i, engine.load_weights.remote(shared_ref, version)))
            elif transport == "broadcast":
                pending.append((i, engine.receive_broadcast.remote(metas, version)))
                weight_sync.send_broadcast(self.groups[i], bks)
            elif transport in ("sglang_distributed", "sglang_distributed_flat"):
                import functools

                from top_rl.rollout import sglang_weights

                def post(meta, engine=engine):
                    return functools.partial(ray.get, engine.sglang_receive_bucket.remote(**meta))

                send = functools.partial(sglang_weights.broadcast_bucket, group=self.groups[i],
                                         flattened=transport.endswith("_flat"))
                try:
                    sglang_weights.sync_distributed(named, bucket_bytes, post, send, weight_version=str(version))
                    pending.append((i, None))
                except Exception as e:  # noqa: BLE001
                    pending.append((i, e))
            elif transport == "ipc":
                handles, bufs = weight_sync.ipc_handles(bks)
                keep_alive.append(bufs)
                pending.append((i, engine.receive_ipc.remote(handles, metas, version)))
            else:
                raise ValueError(f"unknown weight transport {transport!r}")
        out = []
        for i, ref in pending:
            if ref is None or isinstance(ref, Exception):
                out.append((i, None if ref is None else " ".join(str(ref).split())[:600]))
                continue
            try:
                ray.get(ref)
                out.append((i, None))
            except Exception as e:  # noqa: BLE001 - reported per engine; the driver restarts it
                out.append((i, " ".join(str(e).split())[:600]))
        return out

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str) -> None:
        """This rank's shard, written by the rank itself (run_dir must be on storage every node sees)."""
        from top_rl.run import fault_injection
        from top_rl.run import rng
        from top_rl.run import safe_load

        state = {"trainer": self.trainer.state_dict(), "rng": rng.state()}
        with open(path, "wb") as f:  # a Python file: a full disk raises OSError(ENOSPC), torch's own writer loses it
            fault_injection.inject("enospc_in_trainer_checkpoint", path=path)
            torch.save(state, f)
        safe_load.check_saved(path)

    def load_checkpoint(self, path: str) -> None:
        from top_rl.run import rng
        from top_rl.run import safe_load

        state = safe_load.load(path)  # tensors and plain data only: a checkpoint runs no code
        self.trainer.load_state_dict(state["trainer"])
        rng.restore(state["rng"])

    def save_hf(self, path: str) -> None:
        """The policy as a Hugging Face checkpoint, written by rank 0 (every rank takes part in the gather)."""
        named = dict(self.trainer.iter_hf_weights())
        if self.rank != 0:
            return
        from top_rl.model.hf_io import write_hf

        hf_config = self.arch.replace(torch_dtype=str(self.trainer.cfg.dtype)).to_hf_dict()
        write_hf(named, path, hf_config, max_shard_bytes=5 << 30)


def _abort(group: weight_sync.Group) -> None:
    try:
        group.pg.abort()
    except Exception:  # noqa: BLE001 - a group whose peer died may refuse; it is dropped either way
        pass
