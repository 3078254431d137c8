"""Issue 24 (7): a local run listens on loopback only. Ray's servers (GCS, raylet, object manager, core workers,
agents) bind 127.0.0.1, and the trainer's rendezvous serves on a socket bound to the node's address, never on
every interface; checked from the listening sockets of the run's own processes (psutil)."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
WILDCARD = ("0.0.0.0", "::")


def _listening(pids: set[int]) -> list[tuple[str, int, str]]:
    out = []
    for c in psutil.net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            try:
                name = psutil.Process(c.pid).name()
            except psutil.NoSuchProcess:
                name = "?"
            out.append((c.laddr.ip, c.laddr.port, name))
    return out


def _tree(root: psutil.Process) -> set[int]:
    return {root.pid} | {p.pid for p in root.children(recursive=True)}


def _loopback(ip: str) -> bool:
    return ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def test_the_rendezvous_store_serves_on_the_reserved_socket():
    """Rank 0 listens on the node's address it reserved, not on every interface as a TCPStore left to bind does."""
    from top_rl.driver import rendezvous

    port = rendezvous.reserve("127.0.0.1")
    timeout = datetime.timedelta(seconds=60)
    client = {}
    t = threading.Thread(target=lambda: client.setdefault("store", rendezvous.store("127.0.0.1", port, 2, 1, timeout)))
    t.start()
    master = rendezvous.store("127.0.0.1", port, 2, 0, timeout)  # waits for the client
    t.join(60)
    master.set("k", "v")
    assert client["store"].get("k") == b"v"
    mine = [(ip, p) for ip, p, _ in _listening({os.getpid()}) if p == port]
    assert mine == [("127.0.0.1", port)]
    with pytest.raises(RuntimeError, match="was not reserved in this process"):
        rendezvous.store("127.0.0.1", port + 1 if port < 65535 else port - 1, 2, 0, timeout)


def test_gloo_binds_the_interface_holding_the_nodes_address(monkeypatch):
    from top_rl.driver import rendezvous

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "")  # recorded first, so teardown removes what bind_gloo sets
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    rendezvous.bind_gloo("127.0.0.1")
    assert os.environ["GLOO_SOCKET_IFNAME"] == rendezvous.interface_of("127.0.0.1") is not None
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "mine")
    rendezvous.bind_gloo("127.0.0.1")
    assert os.environ["GLOO_SOCKET_IFNAME"] == "mine"  # the user's choice stands


_LOCAL_CLUSTER = r'''
import json, os, sys, time, psutil, ray
from top_rl.driver.actors import TrainerActor
from top_rl.driver.cluster import start_ray
from top_rl.driver.placement import ClusterConfig
start_ray(ClusterConfig(num_cpus=2))  # as the loop starts a local run
from top_rl import contract
from top_rl.kernels.plan import KernelPlan
rank0 = TrainerActor.options(num_cpus=0).remote(0, 2, KernelPlan(contract=contract.DEFAULT.name), 1)
host, port = ray.get(rank0.free_address.remote())
time.sleep(2)
me = psutil.Process()
pids = {me.pid} | {p.pid for p in me.children(recursive=True)}
socks = [(c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name()) for c in psutil.net_connections(kind="inet")
         if c.status == psutil.CONN_LISTEN and c.pid in pids]
print(json.dumps({"rendezvous": [host, port], "node_ip": ray.util.get_node_ip_address(), "listening": socks}))
ray.shutdown()
'''


def test_a_local_cluster_listens_on_loopback_only():
    """Ray started by the loop's own start_ray and a trainer rank's reserved rendezvous: every listening socket of
    the process tree is on loopback."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", _LOCAL_CLUSTER], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    host, port = seen["rendezvous"]
    assert host == seen["node_ip"] == "127.0.0.1" and host != ""
    names = {name for _, _, name in seen["listening"]}
    assert {"gcs_server", "raylet"} <= names, seen["listening"]
    assert [s for s in seen["listening"] if not _loopback(s[0])] == []
    assert [s[0] for s in seen["listening"] if s[1] == port] == ["127.0.0.1"]  # the reserved rendezvous port


@pytest.mark.slow
def test_a_local_run_with_two_trainer_ranks_listens_on_loopback_only(tmp_path):
    """The default job with DP=2 and the trainer broadcasting weights over gloo (rendezvous stores, gloo pairs,
    Ray's servers): its process tree's listening sockets, sampled through the run, are all on loopback."""
    env = {**os.environ, "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "top_rl.cli", f"run_dir={tmp_path}", "steps=2", "trainer.dp=2",
                             "cluster.num_cpus=3", "cluster.weight_transport=broadcast", "rollout.prompts_per_step=4",
                             "rollout.n_samples=4", "cluster.torch_threads=1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    root, seen, deadline = psutil.Process(proc.pid), {}, time.time() + 600
    while proc.poll() is None and time.time() < deadline:
        try:
            for ip, port, name in _listening(_tree(root)):
                seen[(ip, port)] = name
        except psutil.NoSuchProcess:
            pass
        time.sleep(1)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 0, err[-3000:]
    assert any(name.startswith("ray::TrainerActor") for name in seen.values()), seen
    assert {k: v for k, v in seen.items() if not _loopback(k[0])} == {}
