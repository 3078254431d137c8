"""A STAND-IN for an SGLang 0.5.10.post1 server (for tests and CPU dry runs). It is not SGLang.

It answers the request/response shapes of the routes TOP-RL uses, as documented for the pinned release
(shared/reference/sglang-0.5.10.post1-qwen3-numerics.md §8-§9): /generate (batch `input_ids`, per-sample
`sampling_params`, `return_logprob`, `logprob_start_len`; `--skip-tokenizer-init` answers with `output_ids`,
`meta_info.output_token_logprobs`, `meta_info.input_token_logprobs` with its leading null and the scheduler's
token-id quirk), the weight routes ({"success", "message"}, 200/400), /flush_cache, /health, /server_info.

Its numbers come from TOP-RL's own model on the active kernel backend (`reference` on CPU): prefill scores are
`sequence_logprobs`, decoding is the native engine's. So a client or the parity probe tested against it must find
exact equality. Sampling uses the native engine's Gumbel noise, not SGLang's murmur hash: the stand-in's
completions for a seed are not a real server's. Process groups for the distributed weight sync are joined with
the pinned SGLang's own helper (backend gloo on CPU); tensor sync deserialises with SGLang's serializer.

Run as `python -m top_rl.rollout.sglang_standin --model-path DIR --port P [SGLang flags...]` (unknown flags are
accepted and ignored), or in a thread with `StandinServer(...).start()`. Fault injection for tests:
`server.faults.append((path, status, body))` answers the next request to `path` with that status and body;
status 0 closes the connection without answering; status -1 waits float(body) seconds, then answers normally.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import torch

from top_rl import contract
from top_rl.model import hf_state_dict, load_hf_state_dict, load_model, sequence_logprobs
from top_rl.model.hf_io import read_safetensors
from top_rl.rollout.base import SamplingParams
from top_rl.rollout.native import NativeEngine


class BadRequest(Exception):
    pass


def _finite(x):
    """orjson (SGLang's serializer) writes NaN/inf as null; json.dumps would write invalid NaN tokens."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, list):
        return [_finite(v) for v in x]
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    return x


class Standin:
    """The server's state: the model, its weight version, the server args it reports, process groups."""

    def __init__(self, model_path: str, server_args: dict, dtype: str | None = None):
        self.model = load_model(model_path, dtype).eval()
        self.lock = threading.Lock()
        self.args = {"model_path": model_path, "weight_version": "default", **server_args}
        self.groups: dict = {}
        self.faults: list[tuple[str, int, bytes]] = []
        self.requests: list[tuple[str, dict | None]] = []  # (path, body) log for tests
        self.ready_at = 0.0

    # ---------------------------------------------------------------------------------- /generate
    def _triple(self, lp, tok):
        vocab = self.model.cfg.vocab_size
        return [lp, tok if tok < vocab - 1 else 0, None]  # the pinned scheduler's idx clip

    def _input_logprobs(self, ids: list[int], start: int) -> list:
        if start >= len(ids):
            return []
        lps = sequence_logprobs(self.model, [ids], [start + 1])[0].tolist() if start + 1 < len(ids) else []
        return [[None, self._triple(None, ids[start])[1], None]] + [
            self._triple(lp, ids[start + 1 + j]) for j, lp in enumerate(lps)]

    def _one(self, ids: list[int], sp: dict, return_logprob: bool, start: int) -> dict:
        vocab = self.model.cfg.vocab_size
        if not ids or any(not 0 <= t < vocab for t in ids):
            raise BadRequest(f"input_ids must be non-empty ids in [0, {vocab})")
        if start > len(ids):
            raise BadRequest(f"logprob_start_len={start} is higher than the number of input tokens {len(ids)}")
        n_new = int(sp.get("max_new_tokens", 128))
        temp = float(sp.get("temperature", 1.0))
        if float(sp.get("min_p", 0.0)) > 0:
            raise BadRequest("min_p > 0 with a sampling_seed asserts in deterministic mode (§6.3)")
        meta = {"id": uuid.uuid4().hex, "prompt_tokens": len(ids), "weight_version": self.args["weight_version"],
                "total_retractions": 0, "cached_tokens": 0}
        out_ids, out_lps = [], []
        if n_new == 0:
            meta["finish_reason"] = {"type": "length", "length": 0}
        else:
            if temp < 1e-6:
                raise BadRequest("the stand-in does not implement greedy sampling (temperature < 1e-6)")
            eos = -1 if sp.get("ignore_eos") else None
            engine = NativeEngine(self.model, "decode", eos_token_id=eos)
            s = engine.generate([ids], [int(sp.get("sampling_seed", 42))],
                                SamplingParams(n_new, temp, tuple(sp.get("stop_token_ids") or ())))[0]
            out_ids, out_lps = s.response_ids, s.sample_logprobs
            meta["finish_reason"] = ({"type": "stop", "matched": out_ids[-1]} if s.finish_reason == "stop"
                                     else {"type": "length", "length": len(out_ids)})
        meta["completion_tokens"] = len(out_ids)
        if return_logprob:
            meta["input_token_logprobs"] = self._input_logprobs(ids, len(ids) if start == -1 else start)
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(out_lps, out_ids)]
        return {"output_ids": out_ids, "meta_info": meta}

    def generate(self, body: dict):
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not ids:
            raise BadRequest("input_ids is required (the stand-in has no tokenizer: --skip-tokenizer-init)")
        single = isinstance(ids[0], int)
        batch = [ids] if single else ids
        n = len(batch)

        def per_item(key, default):
            v = body.get(key, default)
            v = default if v is None else v
            return v if isinstance(v, list) and not single else [v] * n

        sps, starts = per_item("sampling_params", {}), per_item("logprob_start_len", -1)
        rl = per_item("return_logprob", False)
        with torch.no_grad(), self.lock:
            out = [self._one(list(map(int, b)), sps[i] or {}, bool(rl[i]), int(starts[i])) for i, b in enumerate(batch)]
        return out[0] if single else out

    # ---------------------------------------------------------------------------------- weights
    def _load(self, named: dict[str, torch.Tensor], version: str | None) -> None:
        device = self.model.embed_tokens.device  # tensors may arrive on a GPU (CUDA IPC payloads)
        named = {k: v.to(device) for k, v in named.items()}
        with self.lock:
            sd = hf_state_dict(self.model)
            unknown = set(named) - set(sd)
            if unknown:
                raise BadRequest(f"unknown parameter names {sorted(unknown)[:3]}")
            sd.update(named)
            load_hf_state_dict(self.model, sd, source="weight update")
            if version is not None:
                self.args["weight_version"] = version

    def update_from_disk(self, body: dict) -> dict:
        path = body.get("model_path")
        if not path or not Path(path).is_dir():
            raise BadRequest(f"model_path {path!r} is not a directory")
        self._load(read_safetensors(path), body.get("weight_version"))
        return {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}

    def init_group(self, body: dict) -> dict:
        from sglang.srt.utils.common import init_custom_process_group

        name = body.get("group_name", "weight_update_group")
        self.groups[name] = init_custom_process_group(
            backend=body.get("backend", "nccl"), init_method=f"tcp://{body['master_address']}:{body['master_port']}",
            world_size=int(body["world_size"]), rank=int(body["rank_offset"]), group_name=name)
        return {"success": True, "message": "Succeeded to initialize custom process group."}

    def update_from_distributed(self, body: dict) -> dict:
        import torch.distributed as dist

        from top_rl.rollout.sglang_weights import unflatten

        name = body.get("group_name", "weight_update_group")
        if name not in self.groups:
            raise BadRequest(f"Group {name} not in {list(self.groups)}. Please call `init_weights_update_group` first.")
        meta = {k: body[k] for k in ("names", "dtypes", "shapes")}
        group = self.groups[name]
        if body.get("load_format") == "flattened_bucket":
            nbytes = sum(getattr(torch, d).itemsize * math.prod(s) for d, s in zip(meta["dtypes"], meta["shapes"]))
            flat = torch.empty(nbytes, dtype=torch.uint8)
            dist.broadcast(flat, src=0, group=group)
            named = dict(unflatten(flat, meta))
        else:
            named = {n: torch.empty(s, dtype=getattr(torch, d)) for n, d, s in zip(*meta.values())}
            for h in [dist.broadcast(t, src=0, group=group, async_op=True) for t in named.values()]:
                h.wait()
        self._load(named, body.get("weight_version"))
        return {"success": True, "message": "Succeeded to update parameter online."}

    def destroy_group(self, body: dict) -> dict:
        import torch.distributed as dist

        pg = self.groups.pop(body.get("group_name", "weight_update_group"), None)
        if pg is None:
            return {"success": False, "message": "The group to be destroyed does not exist."}
        dist.destroy_process_group(pg)
        return {"success": True, "message": "Succeeded to destroy custom process group."}

    def update_from_tensor(self, body: dict) -> dict:
        from sglang.srt.utils.common import MultiprocessingSerializer

        if torch.cuda.is_available():  # as SGLang's TP worker: CUDA IPC handles name devices by UUID
            from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
            monkey_patch_torch_reductions()
        obj = MultiprocessingSerializer.deserialize(body["serialized_named_tensors"][0])  # TP rank 0
        if body.get("load_format") == "flattened_bucket":
            flat = obj["flattened_tensor"]
            named = {m.name: flat[m.start_idx:m.end_idx].view(m.dtype).reshape(m.shape) for m in obj["metadata"]}
        else:
            named = dict(obj)
        self._load(named, body.get("weight_version"))
        return {"success": True, "message": "Success"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: Standin  # set on the per-server subclass

    def log_message(self, *args):  # keep test output quiet
        pass

    def _send(self, status: int, body, content_type="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(_finite(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _fault(self, path: str) -> bool:
        for k, (p, status, body) in enumerate(self.state.faults):
            if p == path:
                del self.state.faults[k]
                if status == -1:
                    time.sleep(float(body))
                    return False
                if status == 0:
                    self.close_connection = True
                    self.connection.close()
                else:
                    self._send(status, body, "text/plain")
                return True
        return False

    def do_GET(self):
        self._route("GET")

    def do_POST(self):
        self._route("POST")

    do_PUT = do_POST

    def _route(self, method: str):
        st = self.state
        url = urlparse(self.path)
        path = url.path
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if self._fault(path):
            return
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return self._send(422, {"detail": "invalid JSON body"})
        st.requests.append((path, body))
        if path in ("/health", "/health_generate"):
            return self._send(200 if time.monotonic() >= st.ready_at else 503, b"", "text/plain")
        if path == "/server_info":
            return self._send(200, {**st.args, "version": contract.DEFAULT.sglang_version, "stand_in": True})
        if path == "/model_info":
            return self._send(200, {"model_path": st.args["model_path"], "is_generation": True, "model_type": "qwen3",
                                    "architectures": ["Qwen3ForCausalLM"], "weight_version": st.args["weight_version"]})
        if path == "/flush_cache":
            float(parse_qs(url.query).get("timeout", ["0"])[0])
            return self._send(200, b"Cache flushed.\nPlease check backend logs for more details. "
                                   b"(When there are running or waiting requests, the operation will not be performed.)\n",
                              "text/plain")
        routes = {"/generate": st.generate, "/update_weights_from_disk": st.update_from_disk,
                  "/init_weights_update_group": st.init_group,
                  "/update_weights_from_distributed": st.update_from_distributed,
                  "/destroy_weights_update_group": st.destroy_group,
                  "/update_weights_from_tensor": st.update_from_tensor}
        if path not in routes or method != "POST":
            return self._send(404, {"detail": "Not Found"})
        try:
            out = routes[path](body or {})
        except BadRequest as e:
            if path == "/generate":
                return self._send(400, {"error": {"message": str(e)}})
            return self._send(400, {"success": False, "message": str(e)})
        except Exception as e:  # a server bug answers 500 with its message rather than dropping the connection
            return self._send(500, {"error": {"message": f"{type(e).__name__}: {e}"}})
        if isinstance(out, dict) and out.get("success") is False:
            return self._send(400, out)
        self._send(200, out)


class StandinServer:
    """The stand-in on 127.0.0.1 in a background thread; port 0 picks a free port."""

    def __init__(self, model_path: str, host: str = "127.0.0.1", port: int = 0, dtype: str | None = None,
                 server_args: dict | None = None):
        args = dict(attention_backend="fa3", tp_size=1, enable_deterministic_inference=True, rl_on_policy_target="fsdp",
                    disable_radix_cache=True, skip_tokenizer_init=True, dtype="bfloat16")
        self.state = Standin(model_path, {**args, **(server_args or {})}, dtype)
        handler = type("Handler", (_Handler,), {"state": self.state})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self.port = self.httpd.server_address[1]
        self.faults = self.state.faults
        self._thread: threading.Thread | None = None

    def start(self) -> "StandinServer":
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m top_rl.rollout.sglang_standin", description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--attention-backend", default="fa3")
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--enable-deterministic-inference", action="store_true")
    ap.add_argument("--rl-on-policy-target", default=None)
    ap.add_argument("--disable-radix-cache", action="store_true")
    ap.add_argument("--skip-tokenizer-init", action="store_true")
    ap.add_argument("--standin-dtype", default=None, help="compute dtype of the stand-in's model")
    ap.add_argument("--standin-startup-delay", type=float, default=0.0, help="answer /health 503 this long")
    args, _ = ap.parse_known_args(argv)
    server_args = {k: getattr(args, k) for k in ("attention_backend", "tp_size", "enable_deterministic_inference",
                                                 "rl_on_policy_target", "disable_radix_cache", "skip_tokenizer_init")}
    server = StandinServer(args.model_path, args.host, args.port, args.standin_dtype, server_args)
    server.state.ready_at = time.monotonic() + args.standin_startup_delay
    print(f"stand-in for SGLang {contract.DEFAULT.sglang_version} (not SGLang) serving {args.model_path} on "
          f"{server.url}", flush=True)
    server.httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
