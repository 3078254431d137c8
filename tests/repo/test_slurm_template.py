"""The Slurm template (issue 53 item 4): launch/slurm_render.py fills launch/slurm.sbatch.template, refusing what
would break a cluster run (a relative run_dir above all), and the rendered script, run here with stand-ins for
Slurm (scontrol, srun: each step runs locally, logged with its node) and for Ray (`ray status` listing the nodes;
the launch scripts in PRINT_ONLY mode), starts the head on the first node, one worker per other node pointed at the
head, waits for every node, and submits the run from the head with the absolute run_dir last."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parents[2] / "launch"
spec = importlib.util.spec_from_file_location("slurm_render", LAUNCH / "slurm_render.py")
slurm_render = importlib.util.module_from_spec(spec)
spec.loader.exec_module(slurm_render)

ARGS = {"nodes": "3", "gpus_per_node": "8", "run_dir": "/shared/runs/dapo run"}
OVERRIDES = ["+experiment=dapo_qwen3_4b", "model.path=/shared/models/Qwen3-4B"]


def test_render_refuses_what_breaks_a_cluster_run():
    for values, overrides, msg in [
        ({**ARGS, "run_dir": "runs/dapo"}, OVERRIDES, "run_dir='runs/dapo' is not absolute"),
        ({**ARGS, "nodes": "0"}, OVERRIDES, "nodes='0': a whole number >= 1"),
        ({k: v for k, v in ARGS.items() if k != "run_dir"}, OVERRIDES, "run_dir= required"),
        (ARGS, [*OVERRIDES, "run_dir=/x"], "run_dir= among the overrides"),
        (ARGS, [], "no run overrides"),
    ]:
        with pytest.raises(slurm_render.RenderError, match=msg):
            slurm_render.render(values, overrides)


def _stand_ins(bin_dir: Path, log: Path) -> None:
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "n1\\nn2\\nn3\\n"\n')
    # srun: log the node and the command, run it here (options up to the first word that is not one)
    (bin_dir / "srun").write_text(
        '#!/bin/bash\nhost=?\nwhile [ $# -gt 0 ]; do case "$1" in -w) host=$2; shift 2;; --*) shift;; *) break;; esac; done\n'
        f'echo "$host: $*" >> {log}\nexec "$@"\n')
    (bin_dir / "ray").write_text('#!/bin/sh\n[ "$1" = status ] && printf " 1 node_a\\n 1 node_b\\n 1 node_c\\n"\n')
    (bin_dir / "top-rl").write_text("#!/bin/sh\nexit 0\n")  # submit.sh's dry run: the config is accepted
    for f in bin_dir.iterdir():
        f.chmod(0o755)


def test_rendered_script_starts_head_workers_and_submits(tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(slurm_render.render(ARGS, OVERRIDES))
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert "#SBATCH --nodes=3" in text and "#SBATCH --gpus-per-node=8" in text and "{{" not in text
    log = tmp_path / "srun.log"
    _stand_ins(tmp_path / "bin", log)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "n[1-3]",
           "PRINT_ONLY": "1", "HEAD_START_S": "0", "TOP_RL": str(tmp_path / "bin" / "top-rl")}
    env.pop("RAY_AUTH_TOKEN", None)
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    steps = log.read_text().splitlines()
    head = [s for s in steps if "ray_head.sh" in s]
    workers = sorted(s.split(":")[0] for s in steps if "ray_worker.sh" in s)
    assert len(head) == 1 and head[0].startswith("n1: env RAY_BLOCK=1") and workers == ["n2", "n3"]
    (submit,) = [s for s in steps if "submit.sh" in s]
    assert submit.startswith("n1: env RAY_ADDRESS=http://127.0.0.1:8265")
    assert submit.endswith("+experiment=dapo_qwen3_4b model.path=/shared/models/Qwen3-4B run_dir=/shared/runs/dapo run")
    # what the launch scripts would run (PRINT_ONLY): the head, the workers at the head's address, the job
    assert "ray start --head" in out.stdout and out.stdout.count("ray start --address=") == 2
    assert "ray job submit --address=http://127.0.0.1:8265" in out.stdout
    assert "run_dir=/shared/runs/dapo\\ run" in out.stdout


def test_cli_renders_to_stdout_and_refuses_in_one_line(tmp_path):
    ok = subprocess.run(["python3", str(LAUNCH / "slurm_render.py"), "nodes=2", "run_dir=/shared/r", "--",
                         "+experiment=gsm8k_qwen3_0.6b"], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.startswith("#!/usr/bin/env bash")
    bad = subprocess.run(["python3", str(LAUNCH / "slurm_render.py"), "nodes=2", "run_dir=r", "--", "x=1"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "run_dir='r' is not absolute" in bad.stderr
