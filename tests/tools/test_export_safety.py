"""Issue 30: what `top-rl-export` reads and what it may delete. It copied files from outside the run through a link
planted in a checkpoint (listed in the manifest or not), accepted manifest entries naming paths outside the
checkpoint, replaced any directory that did not look like a run under overwrite=true (a home directory, .ssh
included), silently removed a user's `<out>.export-tmp`, and answered out=/ and out=. with a traceback.
Each case here is refused in one `top-rl-export:` line that names it, and nothing outside the run is touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import rl_runs

from top_rl.tools.export import main as export_main


def _refused(args: list[str], capsys, *needles: str) -> str:
    code = export_main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("top-rl-export: ") and err.count("\n") == 1, err  # one line, no usage, no traceback
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def _outside(tmp_path: Path) -> Path:
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_text("not the run's")
    return d


LINKS = {  # name in hf/ -> (what it points at, manifest recomputed through it)
    "a link to /etc/passwd, not in the manifest": ("notes.txt", lambda tmp: Path("/etc/passwd"), False),
    "a link to /etc/passwd, in a recomputed manifest": ("notes.txt", lambda tmp: Path("/etc/passwd"), True),
    "a link to a file outside the run, in a recomputed manifest": (
        "secret.txt", lambda tmp: _outside(tmp) / "secret.txt", True),
    "a link to a directory outside the run, in a recomputed manifest": ("extra", _outside, True),
}


@pytest.mark.parametrize("case", list(LINKS))
def test_export_never_copies_through_a_link_in_a_checkpoint(tmp_path, capsys, case):
    name, target, recompute = LINKS[case]
    target = target(tmp_path)
    run_dir = tmp_path / "r"
    ckpt = rl_runs.fake_run(run_dir, steps=(1, 2))  # step 1 verifies: the export must not quietly fall back to it
    (ckpt / "hf" / name).symlink_to(target)
    if recompute:
        rl_runs.manifest_through_links(ckpt)
        assert any(n.startswith(f"hf/{name}") for n in json.loads((ckpt / "manifest.json").read_text())["files"])
    out = tmp_path / "e"
    before = rl_runs.tree_hash(run_dir)
    for step in ([], ["step=2"]):
        _refused([f"run_dir={run_dir}", f"out={out}", *step], capsys,
                 f"{ckpt / 'hf' / name}: is a symbolic link (to {target})",
                 "Nothing was exported", "step=N")
        assert not out.exists() and not Path(f"{out}.export-tmp").exists()
    assert rl_runs.tree_hash(run_dir) == before


def test_a_hard_link_in_a_checkpoint_is_refused_and_copies_keep_at_most_the_source_mode(tmp_path, capsys):
    """Issue 54 item 5: a hard link in hf/ to a file outside the run (/etc/shadow for the attacker who knows its bytes
    to fake the manifest), manifest recomputed, was exported as out/notes.txt, mode 0644. A file with more than one
    name is now refused like a symbolic link; and a copy never gets wider permissions than its source."""
    secret = _outside(tmp_path) / "secret.txt"
    os.chmod(secret, 0o600)
    run_dir = tmp_path / "r"
    ckpt = rl_runs.fake_run(run_dir, steps=(1, 2))
    os.link(secret, ckpt / "hf" / "notes.txt")
    rl_runs.manifest_through_links(ckpt)
    out = tmp_path / "e"
    for step in ([], ["step=2"]):
        _refused([f"run_dir={run_dir}", f"out={out}", *step], capsys,
                 f"{ckpt / 'hf' / 'notes.txt'}: is a hard link (2 names for one file, the others possibly outside the "
                 "directory)", "Nothing was exported")
        assert not out.exists()
    (ckpt / "hf" / "notes.txt").unlink()
    rl_runs.manifest_through_links(ckpt)
    weights = next(p for p in (ckpt / "hf").iterdir() if p.name != "config.json" and p.is_file())
    os.chmod(weights, 0o600)
    assert export_main([f"run_dir={run_dir}", f"out={out}"]) == 0, capsys.readouterr().err
    assert (out / weights.name).stat().st_mode & 0o777 == 0o600
    assert (out / "config.json").stat().st_mode & 0o077 == (ckpt / "hf" / "config.json").stat().st_mode & 0o077 & \
        ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("entry", ["../../../../../../../../../../etc/passwd", "/etc/passwd",
                                   "hf/../../../../../../../../../../etc/passwd"])
def test_a_manifest_entry_outside_the_checkpoint_is_refused(tmp_path, capsys, entry):
    run_dir = tmp_path / "r"
    ckpt = rl_runs.fake_run(run_dir)
    rl_runs.manifest_through_links(ckpt, {entry: Path("/etc/passwd")})  # the right size and hash of /etc/passwd
    _refused([f"run_dir={run_dir}", f"out={tmp_path / 'e'}"], capsys,
             f"manifest.json: lists {entry!r}, which is not a plain relative path to a file inside the checkpoint")
    assert not (tmp_path / "e").exists()


def test_a_file_the_manifest_does_not_list_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "r"
    ckpt = rl_runs.fake_run(run_dir)
    (ckpt / "hf" / "notes.txt").write_text("added after the checkpoint was written")
    _refused([f"run_dir={run_dir}", f"out={tmp_path / 'e'}"], capsys,
             f"{ckpt / 'hf' / 'notes.txt'}: is not listed in manifest.json")
    assert not (tmp_path / "e").exists()


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    (home / ".bashrc").write_text("export PATH")
    return home


def test_overwrite_never_replaces_a_directory_that_is_not_an_earlier_export(tmp_path, capsys):
    run_dir = tmp_path / "r"
    rl_runs.fake_run(run_dir)
    home = _home(tmp_path)
    before = rl_runs.tree_hash(home)
    for flag in (["overwrite=true"], []):
        _refused([f"run_dir={run_dir}", f"out={home}", *flag], capsys,
                 f"out={home} holds .bashrc and no top_rl_export.json (it is not a top-rl export)",
                 "overwrite=true replaces only a previous export")
    assert rl_runs.tree_hash(home) == before and (home / ".ssh" / "id_ed25519").exists()

    out = tmp_path / "e"  # an earlier export, then changed by its user: no longer only ours
    assert export_main([f"run_dir={run_dir}", f"out={out}"]) == 0
    capsys.readouterr()
    (out / ".ssh").mkdir()
    (out / ".ssh" / "authorized_keys").write_text("key")
    _refused([f"run_dir={run_dir}", f"out={out}", "overwrite=true"], capsys,
             f"out={out} holds .ssh/authorized_keys, which its top_rl_export.json does not list")
    (out / ".ssh" / "authorized_keys").unlink()
    _refused([f"run_dir={run_dir}", f"out={out}", "overwrite=true"], capsys, "holds the directory .ssh/")
    (out / ".ssh").rmdir()
    (out / "model.safetensors").unlink()  # a listed file gone: what is left is still only ours
    (out / "weights").symlink_to(home)
    _refused([f"run_dir={run_dir}", f"out={out}", "overwrite=true"], capsys,
             f"holds weights, a symbolic link (to {home})")
    (out / "weights").unlink()
    marker = json.loads((out / "top_rl_export.json").read_text())
    (out / "top_rl_export.json").write_text(json.dumps({k: v for k, v in marker.items() if k != "files"}))
    _refused([f"run_dir={run_dir}", f"out={out}", "overwrite=true"], capsys,
             "holds a top_rl_export.json that lists no files")
    (out / "top_rl_export.json").write_text(json.dumps(marker))
    assert rl_runs.tree_hash(home) == before

    # an earlier export (one file already gone) is replaced, and only with overwrite=true
    _refused([f"run_dir={run_dir}", f"out={out}"], capsys, "holds an earlier export; pass overwrite=true")
    assert export_main([f"run_dir={run_dir}", f"out={out}", "overwrite=true"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "top_rl_export.json"]
    assert json.loads((out / "top_rl_export.json").read_text())["files"] == ["config.json", "model.safetensors"]

    link = tmp_path / "link_to_export"
    link.symlink_to(out)
    _refused([f"run_dir={run_dir}", f"out={link}", "overwrite=true"], capsys,
             f"out={link} is a symbolic link (to {out})", f"out={out}")


def test_a_leftover_staging_directory_is_removed_only_when_an_export_left_it(tmp_path, capsys):
    run_dir = tmp_path / "r"
    rl_runs.fake_run(run_dir)
    out = tmp_path / "e"
    mine = tmp_path / "e.export-tmp"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    for flag in ([], ["overwrite=true"]):
        _refused([f"run_dir={run_dir}", f"out={out}", *flag], capsys,
                 f"{mine} (where out={out} is assembled) exists and holds notes.txt and no top_rl_export.json",
                 "it is not removed")
    assert (mine / "notes.txt").read_text() == "the user's" and not out.exists()
    (mine / "notes.txt").unlink()
    mine.rmdir()
    mine.symlink_to(_home(tmp_path))
    _refused([f"run_dir={run_dir}", f"out={out}"], capsys, f"{mine} (where out={out} is assembled) exists and is a "
             "symbolic link")
    mine.unlink()
    # what an export killed mid-copy leaves (its marker is the staging directory's first file): removed
    assert export_main([f"run_dir={run_dir}", f"out={mine.with_name('whole')}"]) == 0
    capsys.readouterr()
    mine.with_name("whole").rename(mine)
    (mine / "model.safetensors").unlink()
    assert export_main([f"run_dir={run_dir}", f"out={out}"]) == 0
    assert not mine.exists() and (out / "model.safetensors").exists()


def test_out_root_and_dot_are_refused_in_one_line(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "r"
    rl_runs.fake_run(run_dir)
    _refused([f"run_dir={run_dir}", "out=/", "overwrite=true"], capsys, "out=/ is the filesystem root (/)")
    monkeypatch.chdir(run_dir)
    _refused(["run_dir=.", "out=.", "overwrite=true"], capsys, f"out=. is the run_dir ({run_dir})")
    home = _home(tmp_path)
    monkeypatch.chdir(home)
    _refused([f"run_dir={run_dir}", "out=.", "overwrite=true"], capsys, "out=. holds .bashrc and no")
    assert (home / ".ssh" / "id_ed25519").exists()
    # the installed command: one line on stderr, no traceback
    res = subprocess.run([sys.executable, "-c", "import sys; from top_rl.cli import export_main; "
                          "sys.exit(export_main())", f"run_dir={run_dir}", "out=/", "overwrite=true"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert res.returncode == 2 and res.stderr.startswith("top-rl-export: out=/ is the filesystem root"), res.stderr
    assert res.stderr.count("\n") == 1
