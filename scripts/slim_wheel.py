"""Rewrite a wheel without the files a GPU call does not need (the lent machine takes at most 64 MiB per call).

    python scripts/slim_wheel.py WHEEL OUT_DIR --drop PREFIX... [--keep-only PREFIX...]

`--drop` removes every file under a prefix (e.g. `ray/rllib/`, `sgl_kernel/flash_ops`); `--keep-only` keeps only
files under the given prefixes plus the wheel's own `.dist-info/` (e.g. `sgl_kernel/`: drops `deep_gemm/`, `lib/`,
...). RECORD is rewritten to list exactly the files kept, so pip installs the result as it would the original. The
output keeps the input's file name (pip reads name, version and tags from it). Prints the sizes before and after.
"""

from __future__ import annotations

import argparse
import os
import sys
import zipfile


def slim(src: str, dest_dir: str, drop: tuple[str, ...] = (), keep_only: tuple[str, ...] = ()) -> str:
    os.makedirs(dest_dir, exist_ok=True)
    out = os.path.join(dest_dir, os.path.basename(src))
    tmp = out + ".tmp"

    def kept(name: str) -> bool:
        if ".dist-info/" in name:
            return True
        if keep_only and not name.startswith(keep_only):
            return False
        return not name.startswith(drop)

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
    a = ap.parse_args(argv)
    out = slim(a.wheel, a.out_dir, tuple(a.drop), tuple(a.keep_only))
    mib = lambda p: os.path.getsize(p) / 2**20  # noqa: E731
    print(f"slim_wheel: {os.path.basename(out)} {mib(a.wheel):.1f} -> {mib(out):.1f} MiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
