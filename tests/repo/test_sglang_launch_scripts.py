"""launch/: the Ray head/worker/submit scripts print the commands they would run (PRINT_ONLY=1), refuse the
contract's forbidden env, and submit.sh composes and checks the run config before using the cluster."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parents[2] / "launch"


def _sh(script, *args, **env):
    full = {**os.environ, "PRINT_ONLY": "1", "NUM_GPUS": "8", "NODE_IP": "10.0.0.1", "WANDB_MODE": "offline",
            "RAY_AUTH_TOKEN": "t0ken", **env}
    for k in ("SGLANG_RETURN_ORIGINAL_LOGPROB", "RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH",
              "RAY_DASHBOARD_HOST"):
        if k not in env:
            full.pop(k, None)
    return subprocess.run(["bash", str(LAUNCH / script), *args], capture_output=True, text=True, env=full, timeout=300)


@pytest.mark.parametrize("script", ["ray_head.sh", "ray_worker.sh", "submit.sh", "_common.sh"])
def test_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(LAUNCH / script)]).returncode == 0


def test_head_and_worker_commands():
    out = _sh("ray_head.sh")
    assert out.returncode == 0, out.stderr
    assert "ray start --head --node-ip-address=10.0.0.1 --port=6379 --dashboard-host=127.0.0.1 --dashboard-port=8265 " \
           "--num-gpus=8 --disable-usage-stats" in out.stdout and "launch/ray_worker.sh 10.0.0.1:6379" in out.stdout
    out = _sh("ray_worker.sh", "10.0.0.1:6379", RAY_BLOCK="1")
    assert out.stdout.startswith("ray start --address=10.0.0.1:6379 --node-ip-address=10.0.0.1 --num-gpus=8")
    assert "--block" in out.stdout
    assert _sh("ray_worker.sh").returncode != 0  # the head address is required
    out = _sh("ray_head.sh", SGLANG_RETURN_ORIGINAL_LOGPROB="1")
    assert out.returncode == 2 and "unset SGLANG_RETURN_ORIGINAL_LOGPROB" in out.stderr


def test_nothing_unauthenticated_is_exposed_by_default(tmp_path):
    """Issue 24 (7): the dashboard and its Jobs API listen on 127.0.0.1 unless RAY_DASHBOARD_HOST opts in, and Ray's
    token authentication is on (RAY_AUTH_MODE=token) for the head, the workers and the submitter; the head makes a
    token when there is none, the others refuse to start without one."""
    home = {"HOME": str(tmp_path)}  # no ~/.ray/auth_token
    out = _sh("ray_head.sh", **home, RAY_AUTH_TOKEN="")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ray get-auth-token --generate \n") and "--dashboard-host=127.0.0.1 " in out.stdout
    for script, args in (("ray_worker.sh", ["10.0.0.1:6379"]), ("submit.sh", ["+experiment=x"])):
        out = _sh(script, *args, **home, RAY_AUTH_TOKEN="")
        assert out.returncode == 2 and "export RAY_AUTH_TOKEN=<the head's `ray get-auth-token`>" in out.stderr
        assert "ray start" not in out.stdout and "ray job submit" not in out.stdout
    assert _sh("ray_worker.sh", "10.0.0.1:6379", **home, RAY_AUTH_TOKEN="", RAY_AUTH_MODE="disabled").returncode == 0
    out = _sh("ray_head.sh", RAY_DASHBOARD_HOST="0.0.0.0")
    assert "--dashboard-host=0.0.0.0 " in out.stdout and "RAY_ADDRESS=http://10.0.0.1:8265" in out.stdout
    assert "without authentication" not in out.stderr  # the token guards it
    out = _sh("ray_head.sh", RAY_DASHBOARD_HOST="0.0.0.0", RAY_AUTH_MODE="disabled")
    assert "listen on 0.0.0.0 without authentication: anyone who reaches port 8265 can run code" in out.stderr


def _fake_top_rl(tmp_path, rc: int, message: str = "") -> Path:
    """A top-rl that records its arguments and exits `rc` (the real dry run is covered by tests/entry/test_config.py,
    which composes every shipped experiment)."""
    fake = tmp_path / "top-rl"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\necho "{message}" >&2\nexit {rc}\n')
    fake.chmod(0o755)
    return fake


def test_submit_checks_the_config_then_submits(tmp_path):
    fake = _fake_top_rl(tmp_path, 0)
    out = _sh("submit.sh", "+experiment=gsm8k_qwen3_0.6b", "steps=3", TOP_RL=str(fake), SUBMIT_NO_WAIT="1")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "calls").read_text() == "+experiment=gsm8k_qwen3_0.6b steps=3 dry_run=true\n"
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("ray job submit --address=http://127.0.0.1:8265 --runtime-env-json=")
    assert '\\"WANDB_MODE\\":\\ \\"offline\\"' in line and "--no-wait" in line
    assert line.endswith(f"-- {fake} +experiment=gsm8k_qwen3_0.6b steps=3")
    out = _sh("submit.sh", "+experiment=x", TOP_RL=str(fake), RAY_ADDRESS="http://10.0.0.1:8265", WANDB_API_KEY="secret")
    assert "--address=http://10.0.0.1:8265" in out.stdout and "secret" not in out.stdout  # secrets stay off argv


def test_submit_stops_on_a_refused_config(tmp_path):
    fake = _fake_top_rl(tmp_path, 2, "top-rl: invalid config: rollout.temperature=0.0")
    out = _sh("submit.sh", "+experiment=gsm8k_qwen3_0.6b", "rollout.temperature=0", TOP_RL=str(fake))
    assert out.returncode == 2 and "rollout.temperature" in out.stderr and "ray job submit" not in out.stdout
    assert _sh("submit.sh").returncode == 2  # overrides are required


def test_check_image(tmp_path, capsys):
    """launch/check_image.py (the Docker build's last step) accepts this venv's pins and catches a changed stack."""
    import importlib.metadata as md
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_image", LAUNCH / "check_image.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text(f"torch=={md.version('torch')}\n")
    bad.write_text("torch==0.0.1\n")
    rc = mod.main(["check_image.py", str(good)])
    if "sglang None" in capsys.readouterr().err:
        pytest.skip("sglang not installed")
    assert rc == 0
    assert mod.main(["check_image.py", str(bad)]) == 1 and "the base image had 0.0.1" in capsys.readouterr().err


def test_check_image_refuses_a_package_the_build_installed_unpinned(tmp_path, capsys):
    """The Docker build's lock check: a package new or changed against the base image's freeze must be pinned, at that
    version, by the lock or the base constraints."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_image", LAUNCH / "check_image.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    before = {"torch": "2.11.0", "numpy": "2.3.1"}
    installed = {"torch": "2.11.0", "numpy": "2.3.1", "ray": "2.60.0", "wandb": "0.31.0", "top-rl": "0.1.0"}
    assert mod.unpinned(installed, before, {"ray": "2.60.0", "wandb": "0.31.0"}) == []
    assert mod.unpinned(installed, before, {"ray": "2.60.0"}) == ["wandb==0.31.0"]  # floated
    assert mod.unpinned(installed, before, {"ray": "2.59.0", "wandb": "0.31.0"}) == ["ray==2.60.0"]  # not the lock's
    assert mod.unpinned({**installed, "numpy": "2.4.0"}, before,
                        {"ray": "2.60.0", "wandb": "0.31.0"}) == ["numpy==2.4.0"]  # a base package changed
    # end to end on this venv: a lock that pins nothing, a 'before' that lacks one installed package
    lock, frozen = tmp_path / "lock", tmp_path / "before"
    lock.write_text("")
    frozen.write_text("".join(f"{d.metadata['Name']}=={d.version}\n" for d in __import__("importlib.metadata").metadata
                              .distributions() if d.metadata["Name"].lower() != "pytest"))
    rc = mod.main(["check_image.py", "--lock", str(lock), "--before", str(frozen)])
    err = capsys.readouterr().err
    assert rc == 1 and "pytest==" in err and "does not pin it" in err


def test_pyproject_requires_the_ray_that_has_token_authentication():
    """launch/ turns on RAY_AUTH_MODE=token, which Ray has from 2.52: an older Ray would ignore it (no auth)."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.version import Version

    assert "RAY_AUTH_MODE:-token" in (LAUNCH / "_common.sh").read_text()
    deps = tomllib.loads((LAUNCH.parent / "pyproject.toml").read_text())["project"]["dependencies"]
    (ray,) = [Requirement(d) for d in deps if Requirement(d).name == "ray"]
    assert not ray.specifier.contains(Version("2.51.9")) and ray.specifier.contains(Version("2.52.0"))
