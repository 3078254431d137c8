"""The GPU jobs scripts/gpu_run.sh launches (`e2e`: runs a, b, c, s, g, g4b) compose on this machine: an override the
schema refuses would otherwise surface only on the GPU machine, after the bundle's install and minutes of device
time. And its install keeps one SGLang release per site dir, the one the carried groups name (scripts/gpu_bundle.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_run.sh"


def _e2e_arrays() -> dict[str, list[str]]:
    """The script's own override arrays (NATIVE, B, G, G4B), evaluated by bash exactly as the e2e stage defines them."""
    text = SCRIPT.read_text()
    start, end = text.index("  NATIVE=("), text.index("  : >\"$OUT/e2e.log\"")
    shown = 'E2E_ROOT=/tmp/e2e; for a in NATIVE B G G4B DAPO; do n="$a[@]"; printf "%s\\0" "$a" "${!n}" ""; done'
    out = subprocess.run(["bash", "-c", text[start:end] + shown], capture_output=True, text=True, check=True).stdout
    arrays, name, items = {}, None, []
    for tok in out.split("\0")[:-1]:
        if name is None:
            name = tok
        elif tok == "":
            arrays[name], name, items = items, None, []
        else:
            items.append(tok)
    return arrays


def test_the_script_defines_the_runs_it_is_checked_for():
    arrays = _e2e_arrays()
    assert arrays["NATIVE"] == ["+experiment=one_node_qwen3_0.6b_arith"]
    # the shipped one-GPU GSM8K recipe as README gives it, nothing added but the random model and checkpoints
    assert arrays["G"] == ["+experiment=gsm8k_qwen3_0.6b_one_gpu", "model.path=null", "checkpoint.every=0"]
    assert {"model=qwen3_4b", "cluster.gpu_handoff=true", "trainer.offload_during_rollout=true",
            "checkpoint.enabled=false"} <= set(arrays["G4B"])
    text = SCRIPT.read_text()
    assert 'g4b) args=("${G4B[@]}" steps="${E2E_G4B_STEPS:-3}" ${E2E_G4B_ARGS:-})' in text


@pytest.mark.parametrize("run", ["a", "b", "s", "g", "g4b", "dapo"])
def test_every_e2e_run_composes(run):
    from top_rl.cli import compose

    arrays = _e2e_arrays()
    overrides = {"a": arrays["NATIVE"], "b": arrays["NATIVE"] + arrays["B"],
                 "s": ["+experiment=one_gpu_qwen3_0.6b_sglang"], "g": arrays["G"],
                 "g4b": arrays["G4B"], "dapo": arrays["DAPO"]}[run]
    cfg = compose(["tracking.wandb_mode=disabled", "tracking.console=true", *overrides, "steps=10"])
    assert cfg.steps == 10
    if run == "g":
        assert cfg.rollout.engine == "sglang" and cfg.rollout.sglang.mem_fraction_static == "auto"
        assert cfg.cluster.gpu_handoff and cfg.rollout.sglang.max_running_requests == 512
        assert cfg.task.name == "gsm8k" and cfg.model.path is None
    if run == "dapo":  # the DAPO task with dynamic sampling and overlong shaping on, at a small shape on one GPU
        assert cfg.task.name == "dapo" and cfg.algo.dynamic_sampling.enabled and cfg.algo.overlong.enabled
        assert cfg.rollout.max_new_tokens == 512 and cfg.trainer.world == 1 and cfg.cluster.colocate
    if run == "g4b":  # Qwen3-4B's shape, random init, 64 prompts x 8 x 1024 new tokens, handoff + offload
        assert (cfg.model.hidden_size, cfg.model.intermediate_size, cfg.model.num_hidden_layers) == (2560, 9728, 36)
        assert cfg.model.path is None and cfg.model.max_position_embeddings == 2048 and cfg.task.name == "gsm8k"
        assert (cfg.rollout.prompts_per_step, cfg.rollout.n_samples, cfg.rollout.max_new_tokens) == (64, 8, 1024)
        assert cfg.cluster.gpu_handoff and cfg.trainer.offload_during_rollout and not cfg.checkpoint.enabled


def _run_install(tree: Path, out: Path, site: Path) -> str:
    """scripts/gpu_run.sh none (the install only) in `tree`, with a python3 whose `pip install --target DIR` lists the
    wheels it was given in DIR/installed and which does nothing else: the release bookkeeping, without pip or torch."""
    stub = tree / "bin" / "python3"
    if not stub.exists():
        stub.parent.mkdir()
        stub.write_text('#!/bin/sh\nif [ "$1 $2" = "-m pip" ]; then\n  while [ $# -gt 0 ]; do\n'
                        '    case "$1" in --target) t=$2; mkdir -p "$t"; shift ;; *.whl) basename "$1" >>"$t/installed" ;; esac\n'
                        '    shift\n  done\nfi\nexit 0\n')
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}", "OUT": str(out), "TOP_RL_SITE": str(site)}
    subprocess.run(["bash", str(tree / "scripts" / "gpu_run.sh"), "none"], check=True, capture_output=True, text=True,
                   env=env, stdin=subprocess.DEVNULL, timeout=60)
    return (out / "summary.md").read_text()


def _carry(tree: Path, groups: dict[str, str | None]) -> None:
    shutil.rmtree(tree / ".gpu_bundle", ignore_errors=True)
    for group, release in groups.items():
        (tree / ".gpu_bundle" / group).mkdir(parents=True)
        (tree / ".gpu_bundle" / group / f"{group}_pkg-1.0-py3-none-any.whl").write_bytes(b"")
        if release:
            (tree / ".gpu_bundle" / group / "RELEASE").write_text(release + "\n")


def test_the_install_names_the_carried_release_and_keeps_one_per_site_dir(tmp_path):
    """gpu_run.sh reads the release scripts/gpu_bundle.sh wrote into each carried group (a group without one: 0.5.11's),
    records it in the site dir and the summary, starts the site dir anew when a carry of another release arrives, and
    installs nothing from groups of two releases."""
    tree, site = tmp_path / "tree", tmp_path / "site"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, tree / "scripts" / "gpu_run.sh")
    _carry(tree, {"core": "0.5.17", "sglang_ref": "0.5.17"})
    summary = _run_install(tree, tmp_path / "out1", site)
    assert f"bundle: SGLang 0.5.17 in {site} (carried now: 0.5.17)" in summary
    _carry(tree, {"flashinfer": "0.5.17"})  # the next carry of the same release adds to the site dir
    _run_install(tree, tmp_path / "out2", site)
    assert (site / "installed").read_text().split() == ["core_pkg-1.0-py3-none-any.whl",
                                                        "sglang_ref_pkg-1.0-py3-none-any.whl",
                                                        "flashinfer_pkg-1.0-py3-none-any.whl"]
    _carry(tree, {"core": None})  # bundled before the marker: 0.5.11's
    summary = _run_install(tree, tmp_path / "out3", site)
    assert f"bundle: SGLang 0.5.11 in {site} (carried now: 0.5.11)" in summary
    assert f"{site} held SGLang 0.5.17's wheels, this carry is 0.5.11's: started anew" in summary
    assert (site / "installed").read_text().split() == ["core_pkg-1.0-py3-none-any.whl"]
    _carry(tree, {"core": "0.5.17", "ray": "0.5.11"})
    summary = _run_install(tree, tmp_path / "out4", site)
    assert "the carried groups hold SGLang releases 0.5.11 0.5.17: nothing installed" in summary
    assert (site / "installed").read_text().split() == ["core_pkg-1.0-py3-none-any.whl"]
    _carry(tree, {})
    assert f"bundle: SGLang 0.5.11 in {site} (carried now: nothing)" in _run_install(tree, tmp_path / "out5", site)


_JOB_STUB = '''#!/bin/sh
# python3 as gpu_run.sh calls it: `-m pip` lists its wheels (above), `-m top_rl.cli` is a job of two steps with a pause
# between them, whatever else (the summary's import check, bench/rl_step.py) prints nothing
if [ "$1 $2" = "-m top_rl.cli" ]; then
  for a in "$@"; do case "$a" in run_dir=*) d=${a#run_dir=} ;; esac; done
  mkdir -p "$d"
  echo "step 1 | abs_diff 0.0"; echo '{"step": 1}' >"$d/metrics.jsonl"
  sleep "$STUB_PAUSE"
  /bin/pwd -P >"$d/cwd" || exit 7  # as ray.init's os.path.abspath(os.curdir): fails where the cwd was removed
  echo "step 2 | abs_diff 0.0"; echo '{"step": 2}' >>"$d/metrics.jsonl"
fi
exit 0
'''


def test_a_detached_job_outlives_the_call_that_started_it_and_the_next_call_follows_it_to_its_end(tmp_path):
    """E2E_DETACH=1: the call returns after E2E_CALL_BUDGET seconds with the job still running in its own session (a
    real process, its pipes not held: the call's own output ends), starts no second job beside it, and refuses to
    start the same run again while it runs; `e2e-wait` (no E2E_DETACH needed: the job's marker says it) keeps to the
    budget too, and follows it to its exit status and rows. Without a job started on the machine, it says so."""
    tree = tmp_path / "tree"

    def lay_tree() -> None:  # as the device does at every call: the carried tree anew, the old one gone
        shutil.rmtree(tree, ignore_errors=True)
        (tree / "scripts").mkdir(parents=True)
        shutil.copy(SCRIPT, tree / "scripts" / "gpu_run.sh")
        (tree / "bin").mkdir()
        (tree / "bin" / "python3").write_text(_JOB_STUB)
        (tree / "bin" / "python3").chmod(0o755)

    lay_tree()
    env = {**os.environ, "PATH": f"{tree / 'bin'}:{os.environ['PATH']}", "TOP_RL_SITE": str(tmp_path / "site"),
           "E2E_ROOT": str(tmp_path), "E2E_POLL_S": "1", "STUB_PAUSE": "8"}
    env.pop("E2E_DETACH", None)

    def call(what: str, out: str, budget: int = 1, **more: str) -> str:
        subprocess.run(["bash", str(tree / "scripts" / "gpu_run.sh"), what], check=True, capture_output=True,
                       text=True, env={**env, "OUT": str(tmp_path / out), "E2E_CALL_BUDGET": str(budget), **more},
                       stdin=subprocess.DEVNULL, timeout=60)
        return (tmp_path / out / "summary.md").read_text()

    first = call("e2e", "out1", E2E_DETACH="1", E2E_RUNS="s s2")
    assert "e2e s: still running after" in first and 'E2E_RUNS="s" bash scripts/gpu_run.sh e2e-wait' in first
    assert "e2e: not started while s runs: s2" in first and not (tmp_path / "e2e_s2.pid").exists()
    pid = int((tmp_path / "e2e_s.pid").read_text())
    os.kill(pid, 0)  # alive after the call that started it returned
    assert os.getsid(pid) != os.getsid(0)  # in a session of its own
    assert (tmp_path / "out1" / "metrics_s.jsonl").read_text().splitlines() == ['{"step": 1}']
    lay_tree()  # the job started from a copy outside the tree (E2E_ROOT/e2e_tree_s), so it outlives this too
    again = call("e2e", "out2", E2E_DETACH="1", E2E_RUNS="s")
    assert "e2e s: a job an earlier call started is still running" in again
    assert int((tmp_path / "e2e_s.pid").read_text()) == pid  # not replaced, not restarted
    assert "e2e s: still running after" in call("e2e-wait", "out3", E2E_RUNS="s")  # the budget holds here too
    done = call("e2e-wait", "out4", budget=30, E2E_RUNS="s")
    assert "e2e s: exit 0 in" in done and "+experiment=one_gpu_qwen3_0.6b_sglang" in done
    assert (tmp_path / "e2e_s" / "cwd").read_text().strip() == str((tmp_path / "e2e_tree_s").resolve())
    assert (tmp_path / "e2e_tree_s" / "scripts" / "gpu_run.sh").is_file()  # the copy of the tree it ran from
    assert (tmp_path / "out4" / "metrics_s.jsonl").read_text().splitlines() == ['{"step": 1}', '{"step": 2}']
    assert (tmp_path / "out4" / "steps_s.log").read_text().splitlines() == ["step 1 | abs_diff 0.0",
                                                                             "step 2 | abs_diff 0.0"]
    assert "no job was started on this machine" in call("e2e-wait", "out5", E2E_RUNS="s")


def test_without_detach_a_call_waits_for_each_job_in_turn(tmp_path):
    """The default: each run in E2E_RUNS is followed to its end by the call that started it, whatever the budget."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, tree / "scripts" / "gpu_run.sh")
    (tree / "bin").mkdir()
    (tree / "bin" / "python3").write_text(_JOB_STUB)
    (tree / "bin" / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{tree / 'bin'}:{os.environ['PATH']}", "TOP_RL_SITE": str(tmp_path / "site"),
           "E2E_ROOT": str(tmp_path), "E2E_POLL_S": "1", "STUB_PAUSE": "1", "E2E_CALL_BUDGET": "0",
           "E2E_RUNS": "s s2", "OUT": str(tmp_path / "out")}
    env.pop("E2E_DETACH", None)
    subprocess.run(["bash", str(tree / "scripts" / "gpu_run.sh"), "e2e"], check=True, capture_output=True, text=True,
                   env=env, stdin=subprocess.DEVNULL, timeout=60)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "e2e s: exit 0 in" in summary and "e2e s2: exit 0 in" in summary and "still running" not in summary
    assert (tmp_path / "e2e_s" / "cwd").read_text().strip() == str(tree.resolve())  # no copy: the call outlives it
    assert (tmp_path / "out" / "metrics_s2.jsonl").read_text().splitlines() == ['{"step": 1}', '{"step": 2}']


def test_the_carried_fa3_build_is_unpacked_checked_and_linked_into_sgl_kernel(tmp_path):
    """A carry of .gpu_bundle/fa3 (scripts/gpu_bundle.sh fa3): gpu_run.sh unpacks it into the site dir with its digest
    checked, and links it into sgl_kernel/ at every call, so a later carry that reinstalls sgl_kernel (pip's --upgrade
    --target replaces the folder) still finds it; a digest that does not match installs nothing."""
    import hashlib
    import lzma
    import sys

    tree, site = tmp_path / "tree", tmp_path / "site"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, tree / "scripts" / "gpu_run.sh")
    shutil.copy(SCRIPT.parent / "flash_ops_xz.py", tree / "scripts" / "flash_ops_xz.py")
    (tree / "bin").mkdir()
    (tree / "bin" / "python3").write_text(  # pip and the rest do nothing; the unpacker runs for real
        f'#!/bin/sh\nif [ "$1" = scripts/flash_ops_xz.py ]; then exec {sys.executable} "$@"; fi\nexit 0\n')
    (tree / "bin" / "python3").chmod(0o755)
    payload = b"an FA3 build" * 1000
    fa3 = tree / ".gpu_bundle" / "fa3"
    fa3.mkdir(parents=True)
    (fa3 / "RELEASE").write_text("0.5.11\n")
    (fa3 / "flash_ops.so.xz").write_bytes(lzma.compress(payload))
    digest = f"{hashlib.sha256(payload).hexdigest()} {len(payload)} sgl_kernel/flash_ops.abi3.so sglang_kernel-0.4.2.whl\n"
    (fa3 / "flash_ops.so.xz.sha256").write_text(digest)
    (site / "sgl_kernel").mkdir(parents=True)  # an earlier carry installed sglang-kernel's slimmed wheel
    env = {**os.environ, "PATH": f"{tree / 'bin'}:{os.environ['PATH']}", "TOP_RL_SITE": str(site)}

    def call(out: str) -> None:
        subprocess.run(["bash", str(tree / "scripts" / "gpu_run.sh"), "none"], check=True, capture_output=True,
                       text=True, env={**env, "OUT": str(tmp_path / out)}, stdin=subprocess.DEVNULL, timeout=60)

    call("out1")
    linked = site / "sgl_kernel" / "flash_ops.abi3.so"
    assert linked.read_bytes() == payload and linked.is_symlink()
    assert "as the wheel's RECORD" in (tmp_path / "out1" / "install.log").read_text()
    shutil.rmtree(fa3)
    shutil.rmtree(site / "sgl_kernel")  # the next carry reinstalls sgl_kernel
    (site / "sgl_kernel").mkdir()
    call("out2")
    assert linked.read_bytes() == payload  # linked again
    fa3.mkdir()
    (fa3 / "RELEASE").write_text("0.5.11\n")
    (fa3 / "flash_ops.so.xz").write_bytes(lzma.compress(b"another kernel"))
    (fa3 / "flash_ops.so.xz.sha256").write_text(digest)
    shutil.rmtree(site / ".fa3")
    call("out3")
    assert "the FA3 build did not unpack" in (tmp_path / "out3" / "install.log").read_text()
    assert not (site / ".fa3" / "flash_ops.abi3.so").exists()


def test_an_fa3_build_in_parts_is_joined_once_its_last_part_has_come(tmp_path):
    """A pack larger than a carry (scripts/gpu_bundle.sh: groups fa3, fa3_2, ...) arrives over several calls: the parts
    wait in the site dir; the call that brings the last joins them in order, unpacks with the digest checked and links
    the build into sgl_kernel/."""
    import hashlib
    import lzma
    import sys

    tree, site = tmp_path / "tree", tmp_path / "site"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, tree / "scripts" / "gpu_run.sh")
    shutil.copy(SCRIPT.parent / "flash_ops_xz.py", tree / "scripts" / "flash_ops_xz.py")
    (tree / "bin").mkdir()
    (tree / "bin" / "python3").write_text(
        f'#!/bin/sh\nif [ "$1" = scripts/flash_ops_xz.py ]; then exec {sys.executable} "$@"; fi\nexit 0\n')
    (tree / "bin" / "python3").chmod(0o755)
    payload = os.urandom(1 << 16) * 3
    packed = lzma.compress(payload)
    half = len(packed) // 2
    digest = f"{hashlib.sha256(payload).hexdigest()} {len(payload)} sgl_kernel/flash_ops.abi3.so sglang_kernel-0.4.5.whl\n"
    (site / "sgl_kernel").mkdir(parents=True)
    env = {**os.environ, "PATH": f"{tree / 'bin'}:{os.environ['PATH']}", "TOP_RL_SITE": str(site)}

    def carry(group: str, part: int, data: bytes, out: str) -> str:
        shutil.rmtree(tree / ".gpu_bundle", ignore_errors=True)
        g = tree / ".gpu_bundle" / group
        g.mkdir(parents=True)
        (g / "RELEASE").write_text("0.5.17\n")
        (g / f"flash_ops.so.xz.part{part}-of-2").write_bytes(data)
        (g / "flash_ops.so.xz.sha256").write_text(digest)
        subprocess.run(["bash", str(tree / "scripts" / "gpu_run.sh"), "none"], check=True, capture_output=True,
                       text=True, env={**env, "OUT": str(tmp_path / out)}, stdin=subprocess.DEVNULL, timeout=60)
        return (tmp_path / out / "install.log").read_text()

    assert "1 of its 2 parts carried so far" in carry("fa3_2", 2, packed[half:], "out1")  # order of calls is free
    assert not (site / "sgl_kernel" / "flash_ops.abi3.so").exists()
    assert "as the wheel's RECORD" in carry("fa3", 1, packed[:half], "out2")
    assert (site / "sgl_kernel" / "flash_ops.abi3.so").read_bytes() == payload
    assert not (site / ".fa3" / "parts").exists()  # joined and removed
