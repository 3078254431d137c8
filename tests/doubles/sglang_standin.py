"""A STAND-IN for an SGLang 0.5.11 or 0.5.17 server (tests and CPU dry runs): SGLang's own front half, a stand-in back.

Front (SGLang's code, imported from the installed wheel): the FastAPI app of `sglang.srt.entrypoints.http_server`
(its routes, methods, validation and error bodies), its `ServerArgs` (built by its own CLI parser in the
subprocess form) and its `TokenizerManager` (request normalization, `SamplingParams(**...)` with
`normalize`/`verify`, validation, response and `meta_info` building, weight-version bookkeeping). Only the
tokenizer manager's two ZMQ sockets are replaced by in-process channels to the stand-in scheduler
(`sglang_standin_scheduler`), which computes with TOP-RL's model. sglang-kernel is absent here: the imports
run with `tests.doubles.sgl_kernel_standin`; served by uvicorn on 127.0.0.1, lifespan off (no OpenAI
handlers, no warmup request).

Run as `python -m tests.doubles.sglang_standin [sglang.launch_server flags...] [--standin-dtype D]
[--standin-startup-delay S]`, or in a thread with `StandinServer(model_path).start()`. For tests:
`server.requests` logs (path, JSON body); `server.faults.append((path, status, body))` answers the next
request to `path` with that status and text body before SGLang sees it; status 0 drops the connection
without answering; status -1 waits float(body) seconds, then lets SGLang answer. `server.scheduler.hold`
(an Event) cleared keeps generations in flight (a busy server).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import os
import socket
import sys
import threading
import time

from top_rl.rollout.sglang.config import free_port
from tests.doubles import sgl_kernel_standin
from tests.doubles.sglang_standin_scheduler import StandinScheduler

_CURRENT: contextvars.ContextVar = contextvars.ContextVar("sglang_standin_state")
_SGLANG: dict = {}

# The contract's launch flags, as keyword arguments of SGLang's ServerArgs (in-thread servers).
DEFAULT_ARGS = dict(attention_backend="fa3", tp_size=1, enable_deterministic_inference=True, rl_on_policy_target="fsdp",
                    disable_radix_cache=True, skip_tokenizer_init=True, dtype="bfloat16")


def sglang_modules() -> dict:
    """SGLang's http_server, tokenizer_manager and server_args modules, imported once per process."""
    if not _SGLANG:
        policy = asyncio.get_event_loop_policy()
        with sgl_kernel_standin.installed():
            from sglang.srt.entrypoints import http_server
            from sglang.srt.managers import tokenizer_manager
            from sglang.srt import server_args
        asyncio.set_event_loop_policy(policy)  # http_server installs uvloop's policy process-wide on import
        http_server._global_state = _PerServerState()  # one process may run several stand-ins
        _SGLANG.update(http_server=http_server, tokenizer_manager=tokenizer_manager, server_args=server_args)
    return _SGLANG


class _PerServerState:
    """Stands in for http_server._global_state: the state of the server the current request came to."""

    def __getattr__(self, name):
        return getattr(_CURRENT.get(), name)


class _Inbox:
    """The tokenizer manager's `recv_from_detokenizer` socket: the scheduler thread delivers outputs into it."""

    def __init__(self):
        self.loop: asyncio.AbstractEventLoop | None = None
        self.queue: asyncio.Queue | None = None
        self.pending: list = []
        self.lock = threading.Lock()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        with self.lock:
            self.loop, self.queue = loop, asyncio.Queue()
            for obj in self.pending:
                loop.call_soon_threadsafe(self.queue.put_nowait, obj)
            self.pending.clear()

    def deliver(self, obj) -> None:
        with self.lock:
            if self.loop is None:
                self.pending.append(obj)
            else:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, obj)

    async def recv_pyobj(self, flags=0):  # 0.5.17's async_sock_recv passes flags
        return await self.queue.get()


def _tokenizer_manager_class():
    base = sglang_modules()["tokenizer_manager"].TokenizerManager

    class StandinTokenizerManager(base):
        """SGLang's TokenizerManager with in-process channels instead of its ZMQ sockets."""

        def __init__(self, server_args, scheduler: StandinScheduler):
            self._standin_scheduler = scheduler
            super().__init__(server_args, None)

        def init_ipc_channels(self, port_args):
            self.recv_from_detokenizer = _Inbox()
            self.send_to_scheduler = self._standin_scheduler
            self._standin_scheduler.deliver = self.recv_from_detokenizer.deliver
            self.tokenizer_ipc_name = None  # 0.5.17: one tokenizer worker (its own init sets these two)
            self.load_snapshot_reader = None

        def auto_create_handle_loop(self):
            if self.event_loop is None:
                super().auto_create_handle_loop()
                self.recv_from_detokenizer.bind(self.event_loop)

    return StandinTokenizerManager


class _Front:
    """ASGI wrapper around SGLang's app: selects this server's state, logs requests, injects faults."""

    def __init__(self, server: "StandinServer"):
        self.server = server

    async def __call__(self, scope, receive, send):
        app = sglang_modules()["http_server"].app
        if scope["type"] != "http":
            return await app(scope, receive, send)
        token = _CURRENT.set(self.server.state)
        try:
            chunks, more = [], True
            while more:
                msg = await receive()
                chunks.append(msg.get("body", b""))
                more = msg.get("more_body", False)
            body = b"".join(chunks)
            if await self._fault(scope["path"], send):
                return
            try:
                self.server.requests.append((scope["path"], json.loads(body) if body else None))
            except ValueError:
                self.server.requests.append((scope["path"], body))
            sent = False

            async def replay():
                nonlocal sent
                if sent:
                    return await receive()
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await app(scope, replay, send)
        finally:
            _CURRENT.reset(token)

    async def _fault(self, path: str, send) -> bool:
        faults = self.server.faults
        for k, (p, status, body) in enumerate(faults):
            if p != path:
                continue
            del faults[k]
            if status == -1:
                await asyncio.sleep(float(body))
                return False
            if status == 0:  # drop the connection: uvicorn's send is a method of the cycle holding the transport
                send.__self__.transport.close()
                return True
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return True
        return False


class StandinServer:
    """The stand-in on `host` in a background thread (port 0 picks a free port). `server_args` overrides
    fields of SGLang's ServerArgs (built with the contract's flags); `sglang_server_args` passes a built one."""

    def __init__(self, model_path: str, host: str = "127.0.0.1", port: int = 0, dtype: str | None = None,
                 server_args: dict | None = None, sglang_server_args=None, startup_delay_s: float = 0.0):
        mods = sglang_modules()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port or free_port(host)))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        sa = sglang_server_args
        if sa is None:
            kw = {**DEFAULT_ARGS, **(server_args or {})}
            # A real server is its own process: what ServerArgs writes to os.environ (0.5.11 sets
            # SGLANG_ENABLE_DETERMINISTIC_INFERENCE and friends) must not leak into the test's process.
            saved = dict(os.environ)
            try:
                sa = mods["server_args"].ServerArgs(model_path=model_path, host=host, port=self.port, device="cpu",
                                                    **kw)
            finally:
                os.environ.clear()
                os.environ.update(saved)
        self.server_args = sa
        self.scheduler = StandinScheduler(model_path, sa, dtype)
        self.tokenizer_manager = _tokenizer_manager_class()(sa, self.scheduler)
        ctx = self.tokenizer_manager.context_len
        self.tokenizer_manager.max_req_input_len = ctx - 1
        scheduler_info = {"stand_in": True, "max_req_input_len": ctx - 1, "max_total_num_tokens": ctx}
        self.state = mods["http_server"]._GlobalState(tokenizer_manager=self.tokenizer_manager, template_manager=None,
                                                      scheduler_info=scheduler_info)
        self.requests: list[tuple[str, object]] = []
        self.faults: list[tuple[str, int, bytes]] = []
        self._ready_at = time.monotonic() + startup_delay_s
        import uvicorn

        self.uvicorn = uvicorn.Server(uvicorn.Config(_Front(self), lifespan="off", log_level="critical",
                                                     loop="asyncio", timeout_graceful_shutdown=1))
        self._thread: threading.Thread | None = None

    def _mark_up_when_ready(self) -> None:
        status = sglang_modules()["tokenizer_manager"].ServerStatus
        time.sleep(max(0.0, self._ready_at - time.monotonic()))
        self.tokenizer_manager.server_status = status.Up  # what SGLang's warmup does once the model answers

    def serve_forever(self) -> None:
        threading.Thread(target=self._mark_up_when_ready, daemon=True).start()
        self.uvicorn.run(sockets=[self.sock])

    def start(self) -> "StandinServer":
        self._thread = threading.Thread(target=self.serve_forever, name=f"standin-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.uvicorn.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the stand-in server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.scheduler.stop()
        self.sock.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.doubles.sglang_standin", add_help=False,
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--standin-dtype", default=None, help="compute dtype of the stand-in's model")
    ap.add_argument("--standin-startup-delay", type=float, default=0.0, help="answer /health 503 this long")
    ours, rest = ap.parse_known_args(argv)
    mods = sglang_modules()
    if "--device" not in rest:
        rest = [*rest, "--device", "cpu"]
    sa = mods["server_args"].prepare_server_args(rest)  # SGLang's own parser and ServerArgs
    server = StandinServer(sa.model_path, sa.host, sa.port, ours.standin_dtype, sglang_server_args=sa,
                           startup_delay_s=ours.standin_startup_delay)
    print(f"stand-in for SGLang {mods['http_server'].__version__} (SGLang's HTTP app and tokenizer manager, "
          f"a stand-in scheduler; not SGLang) serving {sa.model_path} on {server.url}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
