"""rollout.sglang: one SGLang engine's own settings (plain data; the server config built from them and its
refusals: top_rl/rollout/sglang/config.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SglangSettings:
    """rollout.sglang: one SGLang engine's own settings, as a run sets them (Hydra types this class, so each key is
    checked and its default recorded). What an engine takes from the run instead (the checkpoint, the attention
    backend, the log-prob source, TOP on or off) is not a key here but a field of SglangEngineConfig
    (top_rl/rollout/sglang/config.py), filled by top_rl.rollout.sglang.plan.run_defaults: one key per setting, and
    none that exists only to be refused."""

    tp_size: int = 1  # the server's tensor parallelism (1 under TOP: no TP>1 contract)
    host: str = "127.0.0.1"  # the address the server binds
    port: int = 30000  # engine i's server listens on port + i (<= 55535: SGLang adds 10000 for gRPC)
    # The share of the GPU the server takes for its weights and KV pool (of the memory free when it starts). auto: sized
    # on the driver from the GPU, the model, the batch's KV need and a trainer sharing the GPU, turning
    # trainer.offload_during_rollout on where that lets the whole batch run (top_rl/driver/memory_choice.py); None:
    # SGLang's own
    mem_fraction_static: float | str | None = 0.7
    disable_radix_cache: bool = True  # the contract's flag; False only outside flashinfer
    extra_args: list[str] = field(default_factory=list)  # more `sglang.launch_server` flags
    env: dict[str, str] = field(default_factory=dict)  # extra env for the server process
    # How the weights reach the server is cluster.weight_transport (top_rl.weights.transport); these shape each way.
    weights_dir: str = ""  # disk: where versions are written (must be visible to the server); "": run_dir/engines/<i>
    keep_weight_versions: int = 2  # disk: older version dirs are deleted
    flattened_buckets: bool = True  # ipc / broadcast: one uint8 buffer per bucket (SGLang's FlattenedTensorBucket)
    # broadcast: the process groups' name, each connection's `<this>_<engine index>_<port>` (rank 0 holds one group per
    # engine, and an engine restarted joins a new one)
    weight_group_name: str = "top_rl_weight_sync"
    startup_timeout_s: float = 900.0  # model load + CUDA graph capture
    request_timeout_s: float = 1800.0  # one HTTP call (a whole generate batch)
    max_retries: int = 3  # transient failures of idempotent calls (5xx, connection reset)
    retry_backoff_s: float = 1.0  # retry n waits n times this many seconds
    restart_on_failure: bool = True  # dead server -> restart -> retry once (idempotent calls only)
    # Samples per /generate call. The calls of a rollout run concurrently and each call's samples are re-scored as
    # soon as it returns, so the re-score overlaps the others' generation (0: all samples in one call, then one
    # re-score call). Batch invariance makes the samples the same either way.
    request_batch_size: int = 8
    # The server's scheduler sizes (None: SGLang's own choice for the GPU, e.g. CUDA graphs up to batch 256 and
    # 8192-token prefill chunks on an H200): a rollout of N concurrent samples runs at the engine's pace when
    # max_running_requests and cuda_graph_max_bs reach N and the KV pool holds them (mem_fraction_static)
    cuda_graph_max_bs: int | None = None
    max_running_requests: int | None = None  # --max-running-requests (None: SGLang's own)
    chunked_prefill_size: int | None = None  # --chunked-prefill-size (None: SGLang's own)
    python: str = ""  # interpreter that has the pinned sglang installed ("": the one running the engine)
    log_path: str = ""  # server stdout+stderr; default run_dir/logs/<run start>-<pid>/sglang-<i>-port<port>.log
    extra_sampling: dict[str, Any] = field(default_factory=dict)  # more /generate sampling_params (checked)
    skip_version_check: bool = False  # only for experiments on another release; parity is then unproven
    validate_with_parser: bool = True  # parse the command with SGLang's own parser before launching
