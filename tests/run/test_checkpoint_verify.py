"""Issue 14: checkpoints are never trusted blindly. Each carries a manifest (size and SHA-256 of every
file); resume, the stop message and `top-rl-export` verify it. A checkpoint that fails is named with its
bad file and skipped: resume falls back to the newest one that verifies and says so. Corruptions are
made on copies of the shared 6-step run (checkpoint.keep=3: steps 4, 5, 6)."""

from __future__ import annotations

import json
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from tests import rl_runs
from tests.rl_runs import BASE, STEPS

from top_rl.run import checkpoint
from top_rl.run.checkpoint import ResumeRefused
from top_rl.cli import compose
from top_rl.tools.export import main as export_main


@pytest.fixture()
def run_dir(tmp_path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(rl_runs.baseline(), d)
    return d


def _ckpt(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}"


def _resume_cfg(run_dir: Path):
    return compose([f"run_dir={run_dir}", *BASE, f"steps={STEPS}", "resume=true"])

def _refused_naming_exec(run_dir, path):
    """The resume refuses before loading anything, naming the file and the object its pickle names."""
    with pytest.raises(ResumeRefused) as refused:
        checkpoint.prepare(run_dir, _resume_cfg(run_dir))
    assert str(refused.value).startswith(
        f"resume refused: {path}: holds Python objects other than tensors and plain data (builtins.exec): "
        "top-rl loads no code from a checkpoint. Nothing was loaded.")
    return refused



def _truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _flip_a_tensor_byte(path: Path) -> None:
    """One bit in the middle of the largest tensor's bytes (torch.load still loads the file)."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        at = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x40]))
    torch.load(path, weights_only=False)  # the damage is silent to torch: only the manifest sees it


def _flip_a_middle_byte(path: Path) -> None:
    """One bit in the middle of the file (a trainer/ record: the size stays, only the manifest sees it)."""
    with open(path, "r+b") as f:
        at = path.stat().st_size // 2
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x40]))


SHARD = "trainer/__0_0.distcp"  # rank 0's records in the trainer state (torch DCP)


def _scribble(path: Path) -> None:
    """Same size, other bytes (a corrupt JSON / pickle)."""
    data = bytearray(path.read_bytes())
    data[:16] = b"\x00garbage\xff\xfe{[(\x01\x02"[:16].ljust(16, b"#")
    path.write_bytes(bytes(data))


CORRUPTIONS = {
    "truncated shard": (SHARD, _truncate, f"{SHARD}: truncated: "),
    "flipped bytes inside a tensor": (SHARD, _flip_a_middle_byte, f"{SHARD}: its bytes changed after it was written"),
    "corrupt DCP index": ("trainer/.metadata", _scribble, "trainer/.metadata: its bytes changed after it was written"),
    "corrupt state.json": ("state.json", _scribble, "state.json: its bytes changed after it was written"),
    "corrupt driver.pt": ("driver.pt", _scribble, "driver.pt: its bytes changed after it was written"),
    "truncated model.safetensors": ("hf/model.safetensors", _truncate, "hf/model.safetensors: truncated: "),
}


def test_every_file_of_a_checkpoint_is_in_its_manifest(run_dir):
    ckpt = _ckpt(run_dir, STEPS)
    manifest = json.loads((ckpt / "manifest.json").read_text())["files"]
    on_disk = {str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest) == on_disk
    assert {SHARD, "trainer/.metadata", "trainer/trainer_state.json", "trainer/rng_rank000.json", "driver.pt",
            "state.json", "hf/model.safetensors"} <= on_disk
    assert all(manifest[n]["size"] == (ckpt / n).stat().st_size for n in manifest)


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_resume_skips_a_corrupt_checkpoint_naming_the_file_and_falls_back(run_dir, capsys, corruption):
    name, damage, message = CORRUPTIONS[corruption]
    damage(_ckpt(run_dir, STEPS) / name)
    state = checkpoint.prepare(run_dir, _resume_cfg(run_dir))  # reads only: the run would load this state
    out = capsys.readouterr().out
    assert state["step"] == STEPS - 1 and state["path"] == str(_ckpt(run_dir, STEPS - 1))
    assert f"step_{STEPS:06d} fails verification, skipped: {message}" in out
    assert f"resuming from step_{STEPS - 1:06d}, the newest checkpoint that verifies" in out


def test_resume_refuses_when_no_checkpoint_verifies_and_accepts_an_older_format(run_dir, capsys):
    _truncate(_ckpt(run_dir, 4) / "driver.pt")
    _flip_a_middle_byte(_ckpt(run_dir, 5) / SHARD)
    (_ckpt(run_dir, 6) / "manifest.json").unlink()
    with pytest.raises(ResumeRefused) as refused:
        checkpoint.prepare(run_dir, _resume_cfg(run_dir))
    msg = str(refused.value)
    assert f"no checkpoint in {run_dir} verifies" in msg and "step_000006 fails verification, skipped: " \
        "manifest.json: missing" in msg and f"step_000005 fails verification, skipped: {SHARD}" in msg
    assert "step_000004 fails verification, skipped: driver.pt: truncated" in msg
    # a checkpoint from before manifests (state.json format 1) resumes, unverified, with a note
    state_file = _ckpt(run_dir, 6) / "state.json"
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "format": 1}))
    shutil.rmtree(_ckpt(run_dir, 6) / "trainer")  # format 1 kept one torch.save shard per rank
    torch.save({"trainer": {"model": {}}, "rng": {}}, _ckpt(run_dir, 6) / "trainer_rank000.pt")
    assert checkpoint.prepare(run_dir, _resume_cfg(run_dir))["step"] == 6
    assert "has no manifest.json (written by an older top-rl): resuming without verifying it" in capsys.readouterr().out


def _outside(tmp_path: Path) -> Path:
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_text("not the run's")
    return d


def _link_unlisted(ckpt: Path, tmp_path: Path) -> tuple[str, str]:
    (ckpt / "hf" / "notes.txt").symlink_to("/etc/passwd")
    return "hf/notes.txt", "is a symbolic link (to /etc/passwd): top-rl writes only regular files into a checkpoint"


def _link_to_a_directory_listed(ckpt: Path, tmp_path: Path) -> tuple[str, str]:
    (ckpt / "hf" / "extra").symlink_to(_outside(tmp_path))
    rl_runs.manifest_through_links(ckpt)  # hf/extra/secret.txt listed with its true size and hash
    return "hf/extra", f"is a symbolic link (to {tmp_path / 'outside'})"


def _link_replacing_a_listed_file(ckpt: Path, tmp_path: Path) -> tuple[str, str]:
    (ckpt / "state.json").rename(tmp_path / "state.json")
    (ckpt / "state.json").symlink_to(tmp_path / "state.json")  # same bytes, so the manifest still matches
    return "state.json", f"is a symbolic link (to {tmp_path / 'state.json'})"


def _checkpoint_itself_a_link(ckpt: Path, tmp_path: Path) -> tuple[str, str]:
    ckpt.rename(tmp_path / "moved")
    ckpt.symlink_to(tmp_path / "moved")
    return ".", f"is a symbolic link (to {tmp_path / 'moved'})"


def _entry_outside(ckpt: Path, tmp_path: Path) -> tuple[str, str]:
    rl_runs.manifest_through_links(ckpt, {"../../../../../../../../../../etc/passwd": Path("/etc/passwd")})
    return "manifest.json", "lists '../../../../../../../../../../etc/passwd', which is not a plain relative path"


def _unlisted_file(ckpt: Path, tmp_path: Path) -> tuple[str, str]:
    (ckpt / "hf" / "notes.txt").write_text("added later")
    return "hf/notes.txt", "is not listed in manifest.json: top-rl lists every file it writes"


TAMPERING = {f.__name__.strip("_"): f for f in (_link_unlisted, _link_to_a_directory_listed,
                                                 _link_replacing_a_listed_file, _checkpoint_itself_a_link,
                                                 _entry_outside, _unlisted_file)}


@pytest.mark.parametrize("case", list(TAMPERING))
def test_resume_refuses_a_checkpoint_someone_changed_and_reads_nothing_outside_it(run_dir, tmp_path, case):
    """Issue 30: verification read through links (listed in the manifest or not) and manifest entries outside the
    checkpoint, and ignored files the manifest does not list. Each is refused by name, and the resume stops rather
    than falling back to the older checkpoints that verify."""
    ckpt = _ckpt(run_dir, STEPS)
    name, why = TAMPERING[case](ckpt, tmp_path)
    before = rl_runs.tree_hash(run_dir)
    with pytest.raises(ResumeRefused) as refused:
        checkpoint.prepare(run_dir, _resume_cfg(run_dir))
    msg = str(refused.value)
    assert msg.startswith(f"resume refused: {ckpt / name}: {why}") and "Nothing was loaded" in msg, msg
    assert "\n" not in msg and rl_runs.tree_hash(run_dir) == before
    skipped = f"{why}" if name == "." else f"{name}: {why}"
    assert f"{ckpt.name} fails verification, skipped: {skipped}" in checkpoint.resume_hint(run_dir)


class _WritesAMarker:
    """A pickle payload: unpickling it runs Python code (exec) that creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def _plant_payload(ckpt: Path, name: str, marker: Path) -> None:
    from top_rl.run import manifest as checkpoint_manifest

    state = torch.load(ckpt / name, weights_only=False)  # the genuine content (test code: this file is ours)
    state["payload"] = _WritesAMarker(marker)
    torch.save(state, ckpt / name)
    checkpoint_manifest.write(ckpt)  # recomputed: the manifest is a checksum, not a signature
    checkpoint_manifest.verify(ckpt)


@pytest.mark.parametrize("name", ["driver.pt"])
def test_a_checkpoint_that_would_run_code_is_refused_and_never_loaded(run_dir, tmp_path, name):
    """Issue 24: driver.pt and the shards loaded with torch.load(weights_only=False): a payload in driver.pt ran
    during the resume's checks. Now the resume is refused naming the file and the object, and nothing runs,
    neither in the checks nor in the loader the trainer ranks use."""
    import pickle

    marker = tmp_path / "payload_ran"
    ckpt = _ckpt(run_dir, STEPS)
    _plant_payload(ckpt, name, marker)
    before = rl_runs.tree_hash(run_dir)
    _refused_naming_exec(run_dir, ckpt / name)
    assert not marker.exists()
    from top_rl.run import safe_load

    with pytest.raises(pickle.UnpicklingError, match="Unsupported global: GLOBAL exec"):
        safe_load.load(ckpt / name)
    assert not marker.exists()
    assert rl_runs.tree_hash(run_dir) == before
    # the genuine files load under the same loader (what a resume and the trainer ranks read)
    genuine = _ckpt(run_dir, STEPS - 1) / name
    assert torch.equal(safe_load.load(genuine)["rng"]["torch"], torch.load(genuine, weights_only=False)["rng"]["torch"])


def _payload_in_the_dcp_index(ckpt: Path, marker: Path) -> str:
    import pickle

    path = ckpt / "trainer" / ".metadata"
    metadata = pickle.loads(path.read_bytes())  # test code: the genuine index, ours
    metadata.storage_meta.payload = _WritesAMarker(marker)
    path.write_bytes(pickle.dumps(metadata))
    return "trainer/.metadata: names Python objects other than DCP's index (builtins.exec)"


def _payload_in_a_record(ckpt: Path, marker: Path) -> str:
    """A tensor record replaced by a torch.save file with a payload, appended to the shard, the index pointed at it."""
    import io
    import pickle

    index = ckpt / "trainer" / ".metadata"
    metadata = pickle.loads(index.read_bytes())
    key, info = next((k, i) for k, i in metadata.storage_data.items() if k.fqn.startswith("model."))
    shard = ckpt / "trainer" / info.relative_path
    data = shard.read_bytes()
    tensor = torch.load(io.BytesIO(data[info.offset: info.offset + info.length]), weights_only=True)
    record = io.BytesIO()
    torch.save([tensor, _WritesAMarker(marker)], record)
    info.offset, info.length = len(data), len(record.getvalue())
    shard.write_bytes(data + record.getvalue())
    index.write_bytes(pickle.dumps(metadata))
    return (f"{SHARD}: holds Python objects other than tensors and plain data (builtins.exec): top-rl loads no code "
            "from a checkpoint")


@pytest.mark.parametrize("plant", [_payload_in_the_dcp_index, _payload_in_a_record])
def test_a_trainer_state_that_would_run_code_is_refused_by_name_and_never_loaded(run_dir, tmp_path, plant):
    """The trainer state is torch DCP: its index is a pickle (DCP reads it with pickle.load) and its records are
    torch.save files. A payload in either is refused by name before anything loads, and the loader the trainer ranks
    use (top_rl.run.dcp_safe's reader) builds none of it either."""
    from top_rl.run import dist_state
    from top_rl.run import manifest as checkpoint_manifest

    marker = tmp_path / "payload_ran"
    ckpt = _ckpt(run_dir, STEPS)
    message = plant(ckpt, marker)
    checkpoint_manifest.write(ckpt)  # recomputed: the manifest is a checksum, not a signature
    before = rl_runs.tree_hash(run_dir)
    with pytest.raises(ResumeRefused) as refused:
        checkpoint.prepare(run_dir, _resume_cfg(run_dir))
    assert str(refused.value).startswith(f"resume refused: {ckpt / message.split(':')[0]}:{message.split(':', 1)[1]}")
    assert "Nothing was loaded." in str(refused.value) and len(str(refused.value).splitlines()) == 1
    with pytest.raises(ValueError, match="does not load|names Python objects other than DCP's index"):  # the trainer ranks' loader builds none of it either
        dist_state.read_full(ckpt / "trainer")
    assert not marker.exists() and rl_runs.tree_hash(run_dir) == before


def _short_str(text: str) -> bytes:  # SHORT_BINUNICODE
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data


def _stack_global_from_the_memo(code: str) -> bytes:
    """exec(code) with its name taken by STACK_GLOBAL from two memoized strings, the result popped."""
    return (_short_str("builtins") + b"\x94" + _short_str("exec") + b"\x94" + b"00"  # MEMOIZE each, POP both
            + b"h\x00h\x01\x93" + _short_str(code) + b"\x85R0")  # BINGET 0, 1, STACK_GLOBAL; TUPLE1 REDUCE POP


def _inst(code: str) -> bytes:
    """exec(code) by the INST opcode (MARK, the argument, INST module name), the result popped."""
    return b"(V" + code.encode() + b"\nibuiltins\nexec\n0"


def _prefix_data_pkl(path: Path, ops: bytes) -> None:
    """The real torch zip at `path` with `ops` run first in its data.pkl, which then builds the genuine state."""
    with zipfile.ZipFile(path) as z:
        entries = [(i.filename, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in entries:
            if name.endswith("/data.pkl"):
                assert data[:2] == b"\x80\x02"  # PROTO 2, what torch.save writes
                data = data[:2] + ops + data[2:]
            z.writestr(name, data)


def _legacy_with_payload(path: Path, marker: Path) -> None:
    state = torch.load(path, weights_only=False)
    state["payload"] = _WritesAMarker(marker)
    torch.save(state, path, _use_new_zipfile_serialization=False)


DISGUISES = {
    "STACK_GLOBAL from the memo": lambda p, m: _prefix_data_pkl(p, _stack_global_from_the_memo(f"open({str(m)!r}, 'w').close()")),
    "INST": lambda p, m: _prefix_data_pkl(p, _inst(f"open({str(m)!r}, 'w').close()")),
    "legacy non-zip torch.save": _legacy_with_payload,
}


@pytest.mark.parametrize("name", ["driver.pt"])  # the trainer state's records: test_a_trainer_state_that_would_run_code
@pytest.mark.parametrize("disguise", list(DISGUISES))
def test_a_disguised_payload_is_refused_by_name_not_skipped_as_unreadable(run_dir, tmp_path, disguise, name):
    """Issue 30: a payload torch's GLOBAL-only scan cannot read (STACK_GLOBAL on memoized strings, INST, a legacy
    non-zip file) was reported as "unreadable" and the resume went on from an older checkpoint. It is refused naming
    the file and the object, and nothing runs. The payloads are live: torch.load(weights_only=False) runs them."""
    from top_rl.run import manifest as checkpoint_manifest

    ckpt = _ckpt(run_dir, STEPS)
    live, marker = tmp_path / f"live_{name}", tmp_path / "payload_ran"
    shutil.copy(ckpt / name, live)
    DISGUISES[disguise](live, tmp_path / "live_ran")
    assert "rng" in torch.load(live, weights_only=False) and (tmp_path / "live_ran").exists()  # the payload works
    DISGUISES[disguise](ckpt / name, marker)
    checkpoint_manifest.write(ckpt)  # recomputed: the manifest is a checksum, not a signature
    with pytest.raises(Exception):  # what hid it: torch's own scan cannot read this pickle
        torch.serialization.get_unsafe_globals_in_checkpoint(str(ckpt / name))
    before = rl_runs.tree_hash(run_dir)
    _refused_naming_exec(run_dir, ckpt / name)
    assert not marker.exists() and rl_runs.tree_hash(run_dir) == before


def test_a_torn_pickle_naming_nothing_stays_unreadable_and_skipped(run_dir, capsys):
    """A damaged file that names no object cannot run anything: it is skipped as unreadable (manifest recomputed, so
    only the pickle scan sees it), and the resume goes on from the checkpoint before."""
    from top_rl.run import manifest as checkpoint_manifest

    ckpt = _ckpt(run_dir, STEPS)
    with zipfile.ZipFile(ckpt / "driver.pt") as z:
        entries = [(i.filename, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(ckpt / "driver.pt", "w", zipfile.ZIP_STORED) as z:
        for entry, data in entries:
            z.writestr(entry, b"\x80\x02}q\x00(X" if entry.endswith("/data.pkl") else data)  # cut inside a string
    checkpoint_manifest.write(ckpt)
    state = checkpoint.prepare(run_dir, _resume_cfg(run_dir))
    assert state["step"] == STEPS - 1
    assert f"step_{STEPS:06d} fails verification, skipped: driver.pt: unreadable" in capsys.readouterr().out


@pytest.mark.slow
def test_the_cli_refuses_a_checkpoint_that_would_run_code_in_one_line(run_dir, tmp_path):
    marker = tmp_path / "payload_ran"
    _plant_payload(_ckpt(run_dir, STEPS), "driver.pt", marker)
    before = rl_runs.tree_hash(run_dir)
    out = rl_runs.run(run_dir, *BASE, f"steps={STEPS + 2}", "resume=true", timeout=200)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "top-rl: resume refused: " in out.stderr and "top-rl loads no code from a checkpoint" in out.stderr
    assert not marker.exists() and rl_runs.tree_hash(run_dir) == before


def test_export_verifies_skipping_or_refusing_a_corrupt_checkpoint(run_dir, tmp_path, capsys):
    _truncate(_ckpt(run_dir, STEPS) / "hf" / "model.safetensors")
    out = tmp_path / "hf"
    assert export_main([f"run_dir={run_dir}", f"out={out}"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["step"] == STEPS - 1  # the newest checkpoint that verifies
    assert f"step_{STEPS:06d} fails verification, skipped: hf/model.safetensors: truncated" in captured.err
    assert (out / "model.safetensors").stat().st_size == \
        (_ckpt(run_dir, STEPS - 1) / "hf" / "model.safetensors").stat().st_size
    assert export_main([f"run_dir={run_dir}", f"out={tmp_path / 'o6'}", f"step={STEPS}"]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint step {STEPS} fails verification: {_ckpt(run_dir, STEPS) / 'hf' / 'model.safetensors'}: " \
           "truncated" in err and "nothing was exported" in err
    assert not (tmp_path / "o6").exists()


@pytest.mark.slow
def test_resume_from_a_run_whose_newest_checkpoint_is_truncated_is_bitwise_the_straight_run(run_dir):
    straight = rl_runs.baseline()
    _truncate(_ckpt(run_dir, STEPS) / SHARD)
    out = rl_runs.run(run_dir, *BASE, f"steps={STEPS}", "resume=true")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert f"step_{STEPS:06d} fails verification, skipped: {SHARD}: truncated" in out.stdout
    assert f"resuming from step_{STEPS - 1:06d}, the newest checkpoint that verifies" in out.stdout
    assert rl_runs.without_timing(rl_runs.rows(run_dir)) == rl_runs.without_timing(rl_runs.rows(straight))
    assert rl_runs.state_hash(rl_runs.final_checkpoint(run_dir)) == \
        rl_runs.state_hash(rl_runs.final_checkpoint(straight))
    checkpoint.load_verified(rl_runs.final_checkpoint(run_dir))  # the replayed step 6 wrote a whole checkpoint
