"""sgl_kernel's FA3 build (`sgl_kernel/flash_ops.abi3.so`, ~1 GB) as one xz file that fits a device carry (~51 MiB).

  python scripts/flash_ops_xz.py pack WHEEL OUT.xz      the member out of the sglang-kernel wheel, its sha256 checked
                                                        against the wheel's RECORD, xz -9e; writes OUT.xz and
                                                        OUT.xz.sha256 ("<hex> <bytes> <member> <wheel>")
  python scripts/flash_ops_xz.py unpack IN.xz DEST.so   decompresses, checks the digest IN.xz.sha256 names, then renames
                                                        into place (a torn or wrong file is never left at DEST.so)

scripts/gpu_bundle.sh's `fa3` group packs it once per sglang-kernel release (cached beside the wheel cache);
scripts/gpu_run.sh unpacks it on the device into the site dir. The digest is the wheel's own, so what the device loads
is byte for byte what `pip install sglang-kernel==X` installs.
"""

from __future__ import annotations

import base64
import hashlib
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

CHUNK = 16 << 20


def _member(z: zipfile.ZipFile) -> str:
    names = [n for n in z.namelist() if n.startswith("sgl_kernel/flash_ops") and n.endswith(".so")]
    if len(names) != 1:
        sys.exit(f"flash_ops_xz: expected one sgl_kernel/flash_ops*.so in the wheel, found {names}")
    return names[0]


def _record_digest(z: zipfile.ZipFile, member: str) -> tuple[str, int]:
    """The member's sha256 (hex) and size as the wheel's RECORD states them."""
    record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
    for line in z.read(record).decode().splitlines():
        name, digest, size = line.rsplit(",", 2)
        if name == member:
            algo, b64 = digest.split("=", 1)
            assert algo == "sha256", digest
            raw = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
            return raw.hex(), int(size)
    sys.exit(f"flash_ops_xz: {member} is not in the wheel's RECORD")


def pack(wheel: str, out: str) -> None:
    out_p = Path(out)
    out_p.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        member = _member(z)
        want, size = _record_digest(z, member)
        with tempfile.TemporaryDirectory(dir=out_p.parent) as tmp:
            so = Path(tmp) / "flash_ops.abi3.so"
            h = hashlib.sha256()
            with z.open(member) as src, open(so, "wb") as dst:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    dst.write(chunk)
            if (h.hexdigest(), so.stat().st_size) != (want, size):
                sys.exit(f"flash_ops_xz: {member} of {wheel} does not match its RECORD entry (sha256 {want})")
            packed = Path(tmp) / "out.xz"
            if shutil.which("xz"):  # -T: both cores; 9e: the 51 MiB that fits a carry (lzma's 9e gives the same)
                with open(packed, "wb") as f:
                    subprocess.run(["xz", "-9e", "-T0", "-c", str(so)], stdout=f, check=True)
            else:
                with open(so, "rb") as src, lzma.open(packed, "wb", preset=9 | lzma.PRESET_EXTREME) as dst:
                    shutil.copyfileobj(src, dst, CHUNK)
            Path(str(out) + ".sha256").write_text(f"{want} {size} {member} {Path(wheel).name}\n")
            os.replace(packed, out_p)
    print(f"flash_ops_xz: {member} ({size >> 20} MiB, sha256 {want[:12]}...) -> {out} ({out_p.stat().st_size >> 20} MiB)")


def unpack(src: str, dest: str) -> None:
    want, size, member, wheel = Path(src + ".sha256").read_text().split()
    dest_p = Path(dest)
    dest_p.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest_p.with_name(dest_p.name + ".partial")
    h = hashlib.sha256()
    with lzma.open(src, "rb") as f, open(tmp, "wb") as out:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            out.write(chunk)
    got = h.hexdigest()
    if got != want or tmp.stat().st_size != int(size):
        tmp.unlink()
        sys.exit(f"flash_ops_xz: {src} unpacks to sha256 {got}, not {wheel}'s {member} ({want}): nothing installed")
    os.replace(tmp, dest_p)
    print(f"flash_ops_xz: {member} of {wheel} -> {dest} (sha256 {want[:12]}..., as the wheel's RECORD)")


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("pack", "unpack"):
        sys.exit(__doc__)
    (pack if sys.argv[1] == "pack" else unpack)(sys.argv[2], sys.argv[3])
