"""Rewrite a wheel without the files a GPU call does not need (the lent machine takes at most 64 MiB per call).

    python scripts/slim_wheel.py WHEEL OUT_DIR [--drop PREFIX...] [--keep-only PREFIX...]
                                 [--keep-cubin-archs SM...]

`--drop` removes every file under a prefix (e.g. `ray/rllib/`, `sgl_kernel/flash_ops`); `--keep-only` keeps only
files under the given prefixes plus the wheel's own `.dist-info/` (e.g. `sgl_kernel/`: drops `deep_gemm/`, `lib/`,
...); `--keep-cubin-archs sm90` drops every `.cubin` built for another GPU architecture, read from the cubin's own ELF
header, not its name (flashinfer-cubin 0.6.8.post1: 10,560 cubins, every one sm100 or sm103), and refuses a `.cubin`
whose header it cannot read. RECORD is rewritten to list exactly the files kept, so pip installs the result as it would the original. The
output keeps the input's file name (pip reads name, version and tags from it). Prints the sizes before and after.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import zipfile

EM_CUDA = 190  # ELF e_machine of a CUDA binary


def cubin_arch(header: bytes, name: str) -> str:
    """`smXY` of a cubin from its ELF header. The SM is a field of e_flags: bits 8-15 from ELF ABI version 8 (CUDA
    12.8 on: 0x6006402 is sm100, 0x600670a sm103), bits 0-7 before (0x5a0550 is sm80)."""
    if len(header) < 52 or header[:4] != b"\x7fELF" or header[4] != 2:
        raise SystemExit(f"slim_wheel: {name} is not a 64-bit ELF file: its architecture is unknown, nothing written")
    machine = struct.unpack_from("<H", header, 18)[0]
    if machine != EM_CUDA:
        raise SystemExit(f"slim_wheel: {name} is ELF for machine {machine}, not CUDA ({EM_CUDA}): nothing written")
    flags = struct.unpack_from("<I", header, 48)[0]
    return f"sm{(flags >> 8) & 0xFF if header[8] >= 8 else flags & 0xFF}"


def slim(src: str, dest_dir: str, drop: tuple[str, ...] = (), keep_only: tuple[str, ...] = (),
         keep_cubin_archs: tuple[str, ...] = ()) -> str:
    os.makedirs(dest_dir, exist_ok=True)
    out = os.path.join(dest_dir, os.path.basename(src))
    tmp = out + ".tmp"
    foreign: set[str] = set()  # cubins of another architecture (--keep-cubin-archs)
    if keep_cubin_archs:
        with zipfile.ZipFile(src) as z:
            for info in z.infolist():
                if info.filename.endswith(".cubin"):
                    with z.open(info) as f:
                        if cubin_arch(f.read(64), info.filename) not in keep_cubin_archs:
                            foreign.add(info.filename)

    def kept(name: str) -> bool:
        if ".dist-info/" in name:
            return True
        if keep_only and not name.startswith(keep_only):
            return False
        return not name.startswith(drop) and name not in foreign

    with zipfile.ZipFile(src) as z, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as w:
        for info in z.infolist():
            if not kept(info.filename):
                continue
            data = z.read(info)
            if info.filename.endswith(".dist-info/RECORD"):  # RECORD: path,hash,size per line (csv; no commas in paths)
                data = b"".join(line + b"\n" for line in data.split(b"\n")
                                if line and kept(line.decode().split(",", 1)[0]))
            w.writestr(info, data)
    os.replace(tmp, out)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel")
    ap.add_argument("out_dir")
    ap.add_argument("--drop", nargs="*", default=[])
    ap.add_argument("--keep-only", nargs="*", default=[])
    ap.add_argument("--keep-cubin-archs", nargs="*", default=[])
    a = ap.parse_args(argv)
    mib = lambda p: os.path.getsize(p) / 2**20  # noqa: E731
    before = mib(a.wheel)  # before: an OUT_DIR that is the wheel's own directory replaces it in place
    out = slim(a.wheel, a.out_dir, tuple(a.drop), tuple(a.keep_only), tuple(a.keep_cubin_archs))
    print(f"slim_wheel: {os.path.basename(out)} {before:.1f} -> {mib(out):.1f} MiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
