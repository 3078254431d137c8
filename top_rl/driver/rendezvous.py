"""Where a run's processes listen: Ray's servers, the trainer's rendezvous stores and gloo's transport bind the
node's address (a local run's is loopback), never every interface.

A local run (no cluster address) runs Ray in its single-machine mode. Ray binds each of its servers (GCS, raylet,
object manager, core workers, agents) to the node's IP, which on Linux it resolves to the outward interface; it maps
an explicit 127.0.0.1 back to that interface (ray._private.services.resolve_ip_for_localhost), so
`ray.init(_node_ip_address="127.0.0.1")` changes nothing. Its single-machine mode, the one it runs on macOS and
Windows (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0), keeps 127.0.0.1. On a cluster each node's servers bind that node's IP.

Rendezvous: the host reserves a port by listening on the node's address (`reserve`) and torch's TCPStore serves on
that very socket (`store`; a TCPStore left to bind its port listens on every interface), so nothing else can take
the port in between either. gloo binds the interface that holds the node's address (`bind_gloo`).
"""

from __future__ import annotations

import datetime
import os
import socket

LOCAL_RAY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's single-machine mode, on loopback
_reserved: dict[int, socket.socket] = {}  # port -> the listening socket this process reserved it with


def ray_on_loopback() -> None:
    """Before a local `ray.init()`: every server Ray starts listens on 127.0.0.1 only."""
    from ray._private import ray_constants

    os.environ[LOCAL_RAY_ENV] = "0"  # the processes Ray starts read it when they import Ray
    ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported Ray already; ray.init reads it from here


def reserve(host: str) -> int:
    """A port on `host` held by a listening socket of this process until `store` serves on it (or `release`)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.bind((host, 0))
    sock.listen(128)  # peers that connect before the store serves wait in the backlog
    port = sock.getsockname()[1]
    _reserved[port] = sock
    return port


def release(port: int) -> None:
    """Give a reserved port back (a rendezvous another library binds itself, or one never used)."""
    sock = _reserved.pop(port, None)
    if sock is not None:
        sock.close()


def store(host: str, port: int, world: int, rank: int, timeout: datetime.timedelta):
    """The rendezvous store at host:port: rank 0 serves it on the socket it reserved the port with; the others
    connect to it."""
    import torch.distributed as dist

    if rank != 0:
        return dist.TCPStore(host, port, world, False, timeout)
    if port not in _reserved:
        raise RuntimeError(f"rendezvous {host}:{port} was not reserved in this process (rendezvous.reserve)")
    fd = _reserved.pop(port).detach()  # the store owns the socket from here
    return dist.TCPStore(host, port, world, True, timeout, master_listen_fd=fd, use_libuv=True)


def interface_of(host: str) -> str | None:
    """The network interface that holds address `host` on this machine (None: none does)."""
    import psutil

    return next((name for name, addrs in psutil.net_if_addrs().items() if any(a.address == host for a in addrs)),
                None)


def bind_gloo(host: str) -> None:
    """gloo's transport (process groups on CPU, Megatron's gloo groups) listens on the interface holding `host`,
    unless GLOO_SOCKET_IFNAME is set already. Call before any gloo group is made in this process."""
    if not os.environ.get("GLOO_SOCKET_IFNAME"):
        interface = interface_of(host)
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
