"""The two wheel tools the GPU bundle (scripts/gpu_bundle.sh) runs, on stand-in wheels: scripts/flash_ops_xz.py packs
sgl_kernel's FA3 build with the digest its wheel's RECORD states and unpacks only bytes that match it;
scripts/slim_wheel.py keeps exactly the files asked for (by path, or a cubin by the SM its ELF header names) with a
RECORD that lists them."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _flash_ops_wheel(path: Path, payload: bytes, record_payload: bytes | None = None) -> Path:
    """A stand-in sglang-kernel wheel whose RECORD states the sha256 of `record_payload` (default: the payload)."""
    import base64
    import hashlib

    digest = base64.urlsafe_b64encode(hashlib.sha256(record_payload or payload).digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("sgl_kernel/__init__.py", b"")
        z.writestr("sgl_kernel/flash_ops.abi3.so", payload)
        z.writestr("sglang_kernel-0.4.2.dist-info/RECORD",
                   f"sgl_kernel/__init__.py,,0\nsgl_kernel/flash_ops.abi3.so,sha256={digest},"
                   f"{len(record_payload or payload)}\nsglang_kernel-0.4.2.dist-info/RECORD,,\n")
    return path


def _flash_ops_xz(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts/flash_ops_xz.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_the_fa3_build_is_packed_with_the_wheels_digest_and_unpacked_only_when_it_matches(tmp_path):
    """scripts/flash_ops_xz.py: pack checks the member against the wheel's RECORD and writes its digest beside the xz
    file; unpack gives back the same bytes, and a packed file that does not unpack to that digest leaves nothing at the
    destination (the device would otherwise load a torn or foreign kernel)."""
    payload = os.urandom(1 << 16) * 8
    whl = _flash_ops_wheel(tmp_path / "sglang_kernel-0.4.2-cp310-abi3-manylinux2014_x86_64.whl", payload)
    packed = tmp_path / "cache" / "flash_ops.so.xz"
    out = _flash_ops_xz("pack", whl, packed)
    assert out.returncode == 0, out.stderr
    assert packed.stat().st_size < len(payload) // 4  # xz'd
    hexdigest, size, member, wheel = (packed.parent / "flash_ops.so.xz.sha256").read_text().split()
    assert (size, member, wheel) == (str(len(payload)), "sgl_kernel/flash_ops.abi3.so", whl.name)
    dest = tmp_path / "site" / "sgl_kernel" / "flash_ops.abi3.so"
    assert _flash_ops_xz("unpack", packed, dest).returncode == 0
    assert dest.read_bytes() == payload
    (packed.parent / "flash_ops.so.xz.sha256").write_text(f"{'0' * 64} {size} {member} {wheel}\n")  # not its bytes
    dest.unlink()
    out = _flash_ops_xz("unpack", packed, dest)
    assert out.returncode != 0 and "nothing installed" in out.stderr
    assert not dest.exists() and not list(dest.parent.iterdir())


def test_a_wheel_whose_fa3_build_differs_from_its_record_is_not_packed(tmp_path):
    whl = _flash_ops_wheel(tmp_path / "sglang_kernel-0.4.2-cp310-abi3-manylinux2014_x86_64.whl", b"tampered",
                           record_payload=b"the real kernel")
    out = _flash_ops_xz("pack", whl, tmp_path / "flash_ops.so.xz")
    assert out.returncode != 0 and "does not match its RECORD entry" in out.stderr
    assert not (tmp_path / "flash_ops.so.xz").exists() and not (tmp_path / "flash_ops.so.xz.sha256").exists()


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    record = "".join(f"{name},sha256=x,{len(data)}\n" for name, data in files.items()) + "pkg-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("pkg-1.0.dist-info/RECORD", record)
    return path


def test_slim_wheel_keeps_what_is_asked_and_rewrites_record(tmp_path):
    src = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl", {
        "sgl_kernel/__init__.py": b"x", "sgl_kernel/sm90/common_ops.abi3.so": b"so", "sgl_kernel/flash_ops.abi3.so": b"big",
        "sgl_kernel/sm100/common_ops.abi3.so": b"so", "deep_gemm/__init__.py": b"y", "lib/mscclpp.so": b"z",
        "pkg-1.0.dist-info/METADATA": b"Name: pkg"})
    subprocess.run([sys.executable, str(ROOT / "scripts/slim_wheel.py"), str(src), str(tmp_path / "out"),
                    "--keep-only", "sgl_kernel/", "--drop", "sgl_kernel/flash_ops", "sgl_kernel/sm100/"], check=True,
                   capture_output=True)
    with zipfile.ZipFile(tmp_path / "out" / src.name) as z:
        names = sorted(z.namelist())
        record = z.read("pkg-1.0.dist-info/RECORD").decode()
    assert names == ["pkg-1.0.dist-info/METADATA", "pkg-1.0.dist-info/RECORD", "sgl_kernel/__init__.py",
                     "sgl_kernel/sm90/common_ops.abi3.so"]
    assert sorted(line.split(",")[0] for line in record.splitlines()) == ["pkg-1.0.dist-info/METADATA",
                                                                         "pkg-1.0.dist-info/RECORD",
                                                                         "sgl_kernel/__init__.py",
                                                                         "sgl_kernel/sm90/common_ops.abi3.so"]


def _cubin(sm: int, abi_version: int = 8, machine: int = 190) -> bytes:
    """The 64-byte ELF header of a cubin for `sm`: e_flags holds the SM in bits 8-15 from ABI version 8 (CUDA 12.8
    on), in bits 0-7 before (the encodings of flashinfer-cubin 0.6.8.post1's and of older toolkits' cubins)."""
    import struct

    ident = b"\x7fELF" + bytes([2, 1, 1, 0x41, abi_version]) + bytes(7)
    flags = 0x6000002 | (sm << 8) if abi_version >= 8 else 0x500000 | (sm << 16) | sm
    return ident + struct.pack("<HHIQQQIHHHHHH", 2, machine, 1, 0, 64, 0, flags, 64, 0, 0, 64, 0, 0) + b"code"


def test_slim_wheel_keeps_only_the_cubins_of_the_archs_asked(tmp_path):
    """--keep-cubin-archs judges a cubin by its ELF header, not its name (flashinfer-cubin: every cubin sm100 or
    sm103, carried without them for Hopper); headers and checksums stay; a .cubin that is not a CUDA ELF file stops it
    with nothing written."""
    files = {"flashinfer_cubin/__init__.py": b"x", "flashinfer_cubin/cubins/h/fmha/checksums.txt": b"c",
             "flashinfer_cubin/cubins/h/fmha/include/meta.h": b"h",
             "flashinfer_cubin/cubins/h/fmha/fmhaSm100fKernel.cubin": _cubin(100),
             "flashinfer_cubin/cubins/h/fmha/fmhaSm103aKernel.cubin": _cubin(103),
             "flashinfer_cubin/cubins/h/gemm/named_sm100_but_sm90.cubin": _cubin(90),
             "flashinfer_cubin/cubins/h/gemm/old_toolkit_sm90.cubin": _cubin(90, abi_version=7),
             "flashinfer_cubin/cubins/h/gemm/old_toolkit_sm80.cubin": _cubin(80, abi_version=7)}
    src = _wheel(tmp_path / "flashinfer_cubin-1.0-py3-none-any.whl", files)
    def slim(wheel, *archs):
        return subprocess.run([sys.executable, str(ROOT / "scripts/slim_wheel.py"), str(wheel), str(tmp_path / "out"),
                               "--keep-cubin-archs", *archs], capture_output=True, text=True)

    assert slim(src, "sm90").returncode == 0
    kept = ["flashinfer_cubin/__init__.py", "flashinfer_cubin/cubins/h/fmha/checksums.txt",
            "flashinfer_cubin/cubins/h/fmha/include/meta.h", "flashinfer_cubin/cubins/h/gemm/named_sm100_but_sm90.cubin",
            "flashinfer_cubin/cubins/h/gemm/old_toolkit_sm90.cubin"]
    with zipfile.ZipFile(tmp_path / "out" / src.name) as z:
        assert sorted(n for n in z.namelist() if ".dist-info/" not in n) == kept
        assert sorted(line.split(",")[0] for line in z.read("pkg-1.0.dist-info/RECORD").decode().splitlines()
                      if ".dist-info/" not in line) == kept
    assert slim(src, "sm100", "sm103").returncode == 0
    with zipfile.ZipFile(tmp_path / "out" / src.name) as z:
        assert sorted(n.rsplit("/", 1)[1] for n in z.namelist() if n.endswith(".cubin")) == \
            ["fmhaSm100fKernel.cubin", "fmhaSm103aKernel.cubin"]
    for bad, why in ((b"not an elf file at all", "is not a 64-bit ELF file"),
                     (_cubin(90, machine=62), "is ELF for machine 62, not CUDA (190)")):
        src = _wheel(tmp_path / "flashinfer_cubin-2.0-py3-none-any.whl", {**files, "flashinfer_cubin/cubins/x.cubin": bad})
        out = slim(src, "sm90")
        assert out.returncode != 0 and f"flashinfer_cubin/cubins/x.cubin {why}" in out.stderr, out.stderr
        assert not (tmp_path / "out" / src.name).exists() and not (tmp_path / "out" / (src.name + ".tmp")).exists()
