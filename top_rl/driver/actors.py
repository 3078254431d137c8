"""The Ray actors: a rollout engine, and one trainer rank. The driver (top_rl.driver.cluster) places and calls them.

Devices: an actor computes on the GPU(s) Ray gave it (`ray.get_gpu_ids()`, exposed as CUDA_VISIBLE_DEVICES);
an actor Ray gave no GPU computes on the CPU, even on a GPU node (Ray leaves CUDA_VISIBLE_DEVICES unset for
it, so without this it would silently share GPU 0 with everyone).
Weights: engines start empty and are sent every version by trainer rank 0 (top_rl.weights), by the sender
it made for each engine when it connected to it; the engine's actor holds the other end (its receiver, made when it
joined), and its one weight door hands each request to it; the driver never holds them.
"""

from __future__ import annotations

import os
import threading
import time

import ray

from top_rl.observe.startup import imports_without_gc

with imports_without_gc():  # an actor's process imports this module first
    import torch

    from top_rl import kernels
    from top_rl.driver import rendezvous
    from top_rl.driver.plan import EngineSpec, TrainerSpec
    from top_rl.kernels.plan import KernelPlan
    from top_rl.run.fault_injection import NO_FAULTS
    from top_rl.weights import senders
    from top_rl.weights.base import WeightRequest
    from top_rl.weights.group import GROUP_TIMEOUT
    from top_rl.weights.transport import Endpoint, Link


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

    def __init__(self, kernel_plan: KernelPlan, threads: int, log_file: str | None = None):
        """The engine's process, ready for `start`: the driver makes it beside the trainer ranks, so its imports run
        while they build their models. `kernel_plan`: the run's kernels; its contract is the native engine's and the
        SGLang server's alike. `log_file`: where this actor's output is copied (run_dir/logs/)."""
        from top_rl.observe.startup import tee_to

        tee_to(log_file)
        _setup_process(kernel_plan, threads)
        self.kernel_plan = kernel_plan
        self.version = -1
        self.engine = None  # start
        self.receiver: senders.WeightTransport | None = None  # this engine's end of its weight link (join_weights)
        # set once join_weights has made the receiver: rank 0 pushes as soon as its own end is up, which for a process
        # group is before this actor's join call returns (the two calls run concurrently here: max_concurrency=2)
        self.joined = threading.Event()
        self.generate_s = 0.0

    def start(self, spec: EngineSpec) -> float:
        """Start the engine `spec` names (this engine's part of the run plan, top_rl.driver.plan; an SGLang engine's
        server config in it is built and checked once, by preflight): the native engine's model (its weights come
        with the first push) or the SGLang server it launches. Returns the seconds it took (the start-up lines)."""
        t0 = time.monotonic()
        kernel_plan = self.kernel_plan
        if spec.kind == "native":
            from top_rl.model import family
            from top_rl.rollout.native.engine import NativeEngine

            model = family.of(spec.arch).NativeModel(spec.arch, spec.dtype).to(_device())  # weights: the first push
            self.engine = NativeEngine(model, spec.logprob_source)
        elif spec.kind == "sglang":
            from top_rl import contract
            from top_rl.rollout.sglang.engine import SglangEngine

            self.engine = SglangEngine(spec.sglang, kernel_plan.attention, contract.get(kernel_plan.contract))
            self.engine.start()
        else:
            raise ValueError(f"rollout.engine={spec.kind!r}; choose native or sglang")
        return time.monotonic() - t0

    def endpoint(self) -> Endpoint:
        return Endpoint.here()

    def kernel_report(self) -> dict:
        return kernels.report()

    def generate(self, prompts, seeds, params):
        """The samples, each stamped with the weight version it was generated under: SGLang's own report where the
        server gives one (it checks every answer against the version it was last sent), else the version of the last
        push this engine took."""
        t = time.perf_counter()
        samples = self.engine.generate(prompts, seeds, params)
        self.generate_s += time.perf_counter() - t
        for s in samples:
            reported = str(s.meta.get("weight_version", ""))
            s.weight_version = int(reported) if reported.isdigit() else self.version
        return samples

    def generate_seconds(self) -> float:
        """Seconds spent in generate since the last ask (a rollout's waves add up), then zero."""
        seconds, self.generate_s = self.generate_s, 0.0
        return seconds

    def progress(self) -> dict | None:
        """The rollout in flight (samples and tokens done), asked while generate runs: the actor serves two calls at
        once (Cluster._new_engine's max_concurrency), and only this one runs beside another."""
        p = self.engine.progress
        return p.snapshot() if p is not None else None

    def rollout_metrics(self) -> dict:
        return self.engine.rollout_metrics()

    def release_memory(self) -> None:
        self.engine.release_memory()

    def resume_memory(self) -> None:
        self.engine.resume_memory()

    # weights (top_rl.weights): joined once per connection, then received by the variant chosen then
    def join_weights(self, link: Link, index: int, address: tuple[str, int] | None) -> None:
        """Make this engine's end of its link; for a process group, join the one trainer rank 0 hosts at `address`
        for this engine (rank 0 joins concurrently)."""
        cls = senders.TRANSPORTS[link.transport]
        self.joined.clear()
        if address is None:
            self.receiver = cls.join(link, self.engine)
            self.joined.set()
            return
        host, port = address

        def store(world, rank, timeout):
            return rendezvous.store(host, port, world, rank, timeout)

        self.receiver = cls.join(link, self.engine, link.group_name(index, port), host, port, store)
        self.joined.set()

    def receive_weights(self, request: WeightRequest) -> int | None:
        """The one weight door: the request goes to this engine's end of its link, which loads it through the
        engine's weight protocol (top_rl.engine.interface.EngineWeights); the version the engine now holds (None: a
        bucket that is not the version's last)."""
        self.joined.wait(timeout=GROUP_TIMEOUT.total_seconds())  # a join still under way finishes first
        if self.receiver is None or self.receiver.kind != request.transport:
            have = "no link" if self.receiver is None else self.receiver.kind
            raise RuntimeError(f"a {request.transport} weight request reached an engine joined by {have}: "
                               "rank 0 and the engine must connect (join_weights) before a push")
        version = self.receiver.receive(self.engine, request)
        if version is not None:
            self.version = version
        return version

    def health(self):
        return self.engine.health()

    def shutdown(self):
        self.engine.shutdown()


def gpu_memory_gib() -> dict[str, float]:
    """What this rank holds on its GPU after a step, in GiB: `resident` (reserved by the caching allocator: what a
    server sharing the GPU cannot have), `allocated` (live tensors) and the step's `peak` (allocated; reset here)."""
    gib = float(1 << 30)
    out = {"resident": torch.cuda.memory_reserved() / gib, "allocated": torch.cuda.memory_allocated() / gib,
           "peak": torch.cuda.max_memory_allocated() / gib}
    torch.cuda.reset_peak_memory_stats()
    return out


def offloaded_step(trainer, batch, step_cfg, offload: bool):
    """One rl_step; with trainer.offload_during_rollout (cluster.gpu_handoff) the optimizer state comes back from host
    memory before it and goes back after it (top_rl.train.optim), while the server that shares the GPU has given its
    memory back, and the two moves are timed into the report (perf/trainer/onload_s, perf/trainer/offload_s). The
    weight push after the step reads the model's weights, which stay on the GPU."""
    if not offload:
        return trainer.rl_step(batch, step_cfg)
    t = time.perf_counter()
    trainer.optimizer.onload()
    onload_s = time.perf_counter() - t
    report = trainer.rl_step(batch, step_cfg)  # a halted step (the gate's verdict) returns here too
    t = time.perf_counter()
    trainer.optimizer.offload()
    offload_s = time.perf_counter() - t
    if report is not None:
        report.timings["onload"] = onload_s
        report.timings["offload"] = offload_s
    return report


@ray.remote
class TrainerActor:
    """One trainer rank (Megatron-core over the kernel seam). Calls are SPMD: the driver sends each call to
    every rank; rank 0 answers (reports, weights it sends on)."""

    def __init__(self, rank: int, world: int, kernel_plan: KernelPlan, threads: int, log_file: str | None = None):
        from top_rl.observe.startup import tee_to

        tee_to(log_file)  # this rank's output, copied under run_dir/logs/
        _setup_process(kernel_plan, threads)
        self.rank, self.world = rank, world
        self.transports: dict[int, senders.WeightTransport] = {}  # rank 0: engine index -> its variant, made at connect
        self.faults = NO_FAULTS  # test-only: the TrainerSpec's (top_rl.run.fault_injection)

    def endpoint(self) -> Endpoint:
        return Endpoint.here()

    def kernel_report(self) -> dict:
        return kernels.report()

    def check_run_dir(self, run_dir: str, token: str, unseen: bool = False) -> tuple[str, str | None]:
        """This rank's node and what it sees at run_dir (None: the driver's token; top_rl.driver.shared_run_dir).
        `unseen` (test-only, the run_dir_unseen fault): read an empty directory of this process's instead, as a node
        that does not mount run_dir would see it."""
        import tempfile

        from top_rl.driver import shared_run_dir

        node = ray.util.get_node_ip_address()
        if unseen:
            with tempfile.TemporaryDirectory(prefix="top-rl-unseen-") as elsewhere:
                return node, shared_run_dir.read_token(elsewhere, token)
        return node, shared_run_dir.read_token(run_dir, token)

    def free_address(self) -> tuple[str, int]:
        """An address on this node's IP for others to meet at (rank 0: the trainer's rendezvous, weight groups),
        its port reserved by this actor until the rendezvous serves on it (top_rl.driver.rendezvous)."""
        host = ray.util.get_node_ip_address()
        return host, rendezvous.reserve(host)

    def setup(self, address: tuple[str, int], spec: TrainerSpec) -> None:
        """Join the trainer's process group (at rank 0's `address`, from its free_address), build this rank's model
        and load the initial policy: the checkpoint at model.path, or the seeded random init (every rank builds
        the same)."""
        with imports_without_gc():  # megatron-core
            from torch.distributed.constants import default_pg_timeout

            from top_rl.model import source
            from top_rl.run import rng
            from top_rl.train import Trainer
            from top_rl.train.snapshots import PolicySnapshots
            from top_rl.train.parallel import init_process_group

        rng.seed(spec.trainer_cfg.seed)  # every RNG this rank checkpoints starts from a known state
        host, port = address
        if self.world > 1:
            init_process_group(self.rank, self.world,
                               store=rendezvous.store(host, port, self.world, self.rank, default_pg_timeout))
        else:
            rendezvous.release(port)
            init_process_group()
        self.arch = spec.arch
        self.trainer = Trainer(spec.arch, spec.trainer_cfg)
        self.trainer.snapshots = PolicySnapshots(keep=spec.step_cfg.policy_lag)
        self.step_cfg = spec.step_cfg
        self.release_cache = spec.release_cache_after_step
        self.offload = spec.trainer_cfg.offload_during_rollout  # with cluster.gpu_handoff only (config.validate)
        self.faults = spec.faults
        if spec.model_cfg.path:
            self.trainer.load_hf(spec.model_cfg.path)
        else:
            self.trainer.load_hf(source.build(spec.model_cfg, spec.vocab_size, spec.eos_token_id).hf_state_dict())
        self._offload_between_steps()  # the first rollout too runs beside the weights only

    def _offload_between_steps(self) -> None:
        if self.offload:
            self.trainer.optimizer.offload()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def rl_step(self, batch):
        report = offloaded_step(self.trainer, batch, self.step_cfg, self.offload)
        if self.release_cache and torch.cuda.is_available():
            torch.cuda.empty_cache()  # the step's activations: the server resuming on this GPU takes them (gpu_handoff)
        if report is not None and torch.cuda.is_available():
            report.gpu_memory = gpu_memory_gib()
        return report

    # ------------------------------------------------------------------ weights to engines
    def connect(self, index: int, link: Link, engine, address: tuple[str, int] | None) -> None:
        """Rank 0: make engine `index`'s transport (replacing a restarted engine's); for a process group, host it at
        `address` (from free_address) while the engine joins (EngineActor.join_weights)."""
        old = self.transports.pop(index, None)
        if old is not None:
            old.close()
        if not link.needs_group:
            self.transports[index] = senders.connect(link, engine)
            return
        host, port = address

        def store(world, timeout):  # on the socket free_address reserved: the node's address only
            return rendezvous.store(host, port, world, 0, timeout)

        self.transports[index] = senders.connect(link, engine, store, host, port, link.group_name(index, port))

    def push_weights(self, indices: list[int], version: int, bucket_bytes: int) -> list[tuple[int, str | None]]:
        """Every rank gathers; rank 0 sends `version` to each engine in `indices` by its transport. Returns, on rank 0,
        (engine index, error or None) per engine: a dead engine is the driver's to restart. A version older than the
        live weights goes from this rank's copy of it (top_rl.train.snapshots; refused, naming the versions, if it
        holds none)."""
        with self.trainer.snapshots.swapped_in(self.trainer.model, version, f"the weight push of version {version}"):
            named = list(self.trainer.iter_hf_weights())  # collectives on every rank (each tensor a copy)
        errors = [] if self.rank != 0 else senders.push([(i, self.transports[i]) for i in indices], named, version,
                                                        bucket_bytes)
        del named
        if self.release_cache and torch.cuda.is_available():
            # The copies and the transport's buckets would otherwise stay in this rank's allocator through the
            # rollout: on an H100 (2026-12-07, Qwen3-0.6B's shape) the trainer process held 16.4 GiB beside its
            # server at step 5 without this, 15.3 GiB with it.
            torch.cuda.empty_cache()
        return errors

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str) -> None:
        """The trainer's state (weights, optimizer, weight versions, this rank's RNG) into the checkpoint's trainer/
        directory `path`, every rank writing its part (top_rl.run.dist_state: torch DCP; run_dir must be on storage
        every node sees)."""
        from top_rl.run import dist_state

        self.faults.inject("enospc_in_trainer_checkpoint", path=path)
        dist_state.save(self.trainer, path)

    def load_checkpoint(self, path: str, version: int) -> None:
        """The trainer's state from the checkpoint's trainer/ directory `path`, resharded to this run's layout, or (a
        checkpoint before format 3) this rank's own shard `trainer_rankNNN.pt`, on the layout it was written with;
        `version`: the weight version the driver resumes at (the checkpoint's step + 1)."""
        from top_rl.run import rng
        from top_rl.run import safe_load

        if not path.endswith(".pt"):
            from top_rl.run import dist_state

            dist_state.load(self.trainer, path)
            if self.trainer.snapshots.current != version:
                raise ValueError(f"{path} holds weight version {self.trainer.snapshots.current}, the resume expects "
                                 f"version {version} (its step + 1)")
            self._offload_between_steps()
            return
        state = safe_load.load(path)  # tensors and plain data only: a checkpoint runs no code
        self.trainer.load_state_dict(state["trainer"])
        saved = state["trainer"].get("policy_versions")
        if saved is None:  # a shard from before weight versions were recorded
            self.trainer.snapshots.current = version
        elif self.trainer.snapshots.current != version:
            raise ValueError(f"{path} holds weight version {self.trainer.snapshots.current}, the resume expects "
                             f"version {version} (its step + 1)")
        rng.restore(state["rng"])
        self._offload_between_steps()  # loading brought the optimizer state onto the GPU

    def save_hf(self, path: str) -> None:
        """The policy as a Hugging Face checkpoint, written by rank 0 (every rank takes part in the gather)."""
        named = dict(self.trainer.iter_hf_weights())
        if self.rank != 0:
            return
        from top_rl.model.hf_io import write_hf

        hf_config = self.arch.replace(torch_dtype=str(self.trainer.cfg.dtype)).to_hf_dict()
        write_hf(named, path, hf_config, max_shard_bytes=5 << 30)

