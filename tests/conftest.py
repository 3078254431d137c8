"""Suite-wide guard: a test must leave the process environment's engine and project variables as it found them.

SGLang's ServerArgs writes SGLANG_* variables into os.environ when built in-process (sglang/srt/server_args.py
`_handle_environment_variables`), and `rendezvous.bind_gloo` sets GLOO_SOCKET_IFNAME for the process's life; a leak
makes a later test (or the run it launches) see an environment no user has. Pinning a contract's own engine value
(`top_rl.kernels.sglang.engine_env.pin_engine_env`, process-global by design) is the one change allowed.

WANDB_SERVICE: wandb puts its service's address there for child processes to share; a test that used wandb in-process
and left it set made every later `top-rl` subprocess log into this pytest's service (the CI failure of the SIGKILL
resume test: the killed driver's run stayed "in use" there). Such a test ends its service with `wandb.teardown()`."""
import os

import pytest

_WATCHED = ("SGLANG_", "TOP_RL_", "NCCL_", "GLOO_", "WANDB_SERVICE")


def _contract_pins() -> set[tuple[str, str]]:
    from top_rl import contract

    # tests/sglang_cpu.py sets SGLANG_USE_CPU_ENGINE=1 when first imported, before sglang is (process-wide by design)
    return {kv for c in contract.CONTRACTS.values() for kv in c.engine_env} | {("SGLANG_USE_CPU_ENGINE", "1")}


def _watched_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(_WATCHED)}


@pytest.fixture(autouse=True)
def _environment_is_left_as_found():
    before = _watched_env()
    yield
    after = _watched_env()
    if after != before:
        changed = sorted(k for k in before.keys() | after.keys()
                         if before.get(k) != after.get(k) and (k, after.get(k)) not in _contract_pins())
        if not changed:
            return
        for k in changed:  # put back what leaked, so one failure does not cascade
            if k in before:
                os.environ[k] = before[k]
            else:
                del os.environ[k]
        pytest.fail("the test changed the process environment and did not restore it: "
                    + ", ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in changed))
