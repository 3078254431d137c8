"""HTTP transport to one SGLang 0.5.11 server: endpoints, retries, and errors that name the endpoint.

Retries: a call marked idempotent (generation with fixed seeds, re-scoring, health, cache flush, a disk weight
load of the same path) is retried on connection failures and HTTP 5xx, `max_retries` times with linear backoff;
a read timeout is not retried (the server is busy or hung: the engine then decides by /health).
A 4xx is the server refusing this request and is never retried. A weight broadcast is never retried here: the
server posts its NCCL receives when the request arrives, so a blind retry would hang or load half-sent weights.
Response shapes are §8-§9 of the numerics page (weight routes answer {"success", "message"}, 200 or 400).
"""

from __future__ import annotations

import time
from typing import Any

import requests
import requests.adapters


class SglangError(RuntimeError):
    def __init__(self, message: str, endpoint: str = "", status: int | None = None):
        super().__init__(message)
        self.endpoint = endpoint
        self.status = status


class SglangUnavailable(SglangError):
    """No answer (connection refused/reset, timeout) or 5xx after the retries: the server may be dead."""


class SglangHTTPError(SglangError):
    """The server answered with an error status or {"success": false}."""


class SglangProtocolError(SglangError):
    """The server answered 2xx with a body that is not the documented shape (bad JSON, missing fields)."""


_RETRY_STATUS = {500, 502, 503, 504}
POOL_SIZE = 256


def _error_text(resp: requests.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "message" in body:
            return str(body["message"])
        if "detail" in body:
            return str(body["detail"])
    return str(body)[:500]


def _version(weight_version) -> str | None:
    """SGLang's request dataclasses type weight_version as Optional[str]: an int is a 400 there."""
    if weight_version is not None and not isinstance(weight_version, str):
        raise TypeError(f"weight_version={weight_version!r} must be a str (SGLang answers 400 to a "
                        f"{type(weight_version).__name__}); pass str({weight_version!r})")
    return weight_version


class SglangClient:
    def __init__(self, url: str, timeout_s: float = 1800.0, max_retries: int = 3, backoff_s: float = 1.0):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.session = requests.Session()
        self.session.trust_env = False  # never route a cluster-local server through an HTTP proxy
        # a rollout's calls run concurrently (top_rl.rollout.sglang.rollout): one kept connection each
        adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=POOL_SIZE)
        self.session.mount("http://", adapter)

    # ------------------------------------------------------------------------------------ transport
    def request(self, method: str, path: str, *, json: Any = None, params: dict | None = None,
                idempotent: bool = False, expect_json: bool = True, timeout: float | None = None) -> Any:
        endpoint = f"{method} {path}"
        attempts = 1 + (self.max_retries if idempotent else 0)
        last: SglangError | None = None
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff_s * attempt)
            try:
                resp = self.session.request(method, self.url + path, json=json, params=params,
                                            timeout=timeout or self.timeout_s)
            except requests.ReadTimeout as e:  # connected, but no answer in time: retrying would only wait again
                raise SglangUnavailable(f"{endpoint} at {self.url}: no answer within {timeout or self.timeout_s:g}s "
                                        f"({e}); raise request_timeout_s for long generations", endpoint) from None
            except (requests.ConnectionError, requests.Timeout) as e:
                last = SglangUnavailable(f"{endpoint} at {self.url}: no answer ({type(e).__name__}: {e})", endpoint)
                continue
            if resp.status_code in _RETRY_STATUS:
                last = SglangUnavailable(
                    f"{endpoint} at {self.url}: HTTP {resp.status_code}: {_error_text(resp)}", endpoint, resp.status_code)
                continue
            if resp.status_code >= 400:
                raise SglangHTTPError(f"{endpoint} at {self.url}: HTTP {resp.status_code}: {_error_text(resp)}",
                                      endpoint, resp.status_code)
            if not expect_json:
                return resp.text
            try:
                return resp.json()
            except ValueError:
                raise SglangProtocolError(
                    f"{endpoint} at {self.url} returned invalid JSON (HTTP {resp.status_code}, {len(resp.content)} "
                    f"bytes): {resp.text[:200]!r}", endpoint, resp.status_code) from None
        assert last is not None
        if attempts > 1:
            last.args = (f"{last.args[0]} (after {attempts} attempts)",)
        raise last

    def _admin(self, path: str, body: dict, idempotent: bool = False, timeout: float | None = None) -> dict:
        """Weight/group routes: 200 {"success": true, ...}; failures are 400 {"success": false, "message"}."""
        out = self.request("POST", path, json=body, idempotent=idempotent, timeout=timeout)
        if not isinstance(out, dict) or not isinstance(out.get("success"), bool):
            raise SglangProtocolError(f"POST {path} at {self.url}: expected {{'success': bool, 'message': str}}, "
                                      f"got {str(out)[:200]}", f"POST {path}")
        if not out["success"]:
            raise SglangHTTPError(f"POST {path} at {self.url} failed: {out.get('message')}", f"POST {path}")
        return out

    # ------------------------------------------------------------------------------------ endpoints
    def health(self, timeout: float = 30.0) -> bool:
        """GET /health: 200 once the server is up (503 while starting or shutting down, §9)."""
        try:
            return self.session.get(self.url + "/health", timeout=timeout).status_code == 200
        except (requests.ConnectionError, requests.Timeout):
            return False

    def server_info(self) -> dict:
        """GET /server_info: the server's ServerArgs plus "version" (the running SGLang release)."""
        out = self.request("GET", "/server_info", idempotent=True)
        if not isinstance(out, dict):
            raise SglangProtocolError(f"GET /server_info at {self.url}: expected an object", "GET /server_info")
        return out

    def generate(self, payload: dict, idempotent: bool = True) -> Any:
        return self.request("POST", "/generate", json=payload, idempotent=idempotent)

    def flush_cache(self, timeout_s: float = 0.0) -> None:
        """Refused (400) while requests run unless `timeout_s` lets the server wait for them (§9)."""
        self.request("POST", "/flush_cache", params={"timeout": timeout_s}, idempotent=True, expect_json=False)

    def update_weights_from_disk(self, model_path: str, weight_version: str | None = None, flush_cache: bool = True,
                                 load_format: str | None = None) -> dict:
        body = {"model_path": model_path, "flush_cache": flush_cache, "weight_version": _version(weight_version),
                "torch_empty_cache": flush_cache}
        if load_format is not None:
            body["load_format"] = load_format
        return self._admin("/update_weights_from_disk", body, idempotent=True)  # same path reloads the same bits

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str, backend: str = "nccl") -> dict:
        return self._admin("/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend})

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        group_name: str, weight_version: str | None = None, flush_cache: bool = True,
                                        load_format: str | None = None) -> dict:
        return self._admin("/update_weights_from_distributed", {
            "names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name, "flush_cache": flush_cache,
            "torch_empty_cache": flush_cache,
            "weight_version": _version(weight_version), "load_format": load_format})

    def destroy_weights_update_group(self, group_name: str) -> dict:
        return self._admin("/destroy_weights_update_group", {"group_name": group_name})

    def update_weights_from_tensor(self, serialized_named_tensors: list[str], load_format: str | None = None,
                                   weight_version: str | None = None, flush_cache: bool = True) -> dict:
        return self._admin("/update_weights_from_tensor", {
            "serialized_named_tensors": serialized_named_tensors, "load_format": load_format,
            "flush_cache": flush_cache, "torch_empty_cache": flush_cache, "weight_version": _version(weight_version)})

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """The server gives back its GPU memory (weights, KV pool, CUDA graphs; needs --enable-memory-saver and an
        idle server, §9). Its weights are then gone until resumed and pushed again."""
        self.request("POST", "/release_memory_occupation", json={"tags": tags}, expect_json=False)

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.request("POST", "/resume_memory_occupation", json={"tags": tags}, expect_json=False)

    def close(self) -> None:
        self.session.close()
