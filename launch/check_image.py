"""Check that this environment is the one TOP-RL's contract was written for (run by the Dockerfile's build;
useful on any GPU node):  python launch/check_image.py [constraints.txt]

Checks: Python 3.12, an sglang release with a TOP contract (top_rl/sglang_release/: 0.5.11, 0.5.17), megatron-core 0.19.x, top_rl importable, and (given the
constraints file written from the base image) that no install changed the image's CUDA stack.
"""

import importlib.metadata as md
import re
import sys


def main(argv: list[str]) -> int:
    from top_rl import contract, sglang_release

    errors = []
    if sys.version_info[:2] != (3, 12):
        errors.append(f"Python {sys.version.split()[0]}; TOP-RL needs 3.12")
    try:
        sg = md.version("sglang")
    except md.PackageNotFoundError:
        sg = None
    if sg not in sglang_release.RELEASES:
        errors.append(f"sglang {sg}; the releases with a TOP contract are {sglang_release.supported()}")
    try:
        mc = md.version("megatron-core")
    except md.PackageNotFoundError:
        mc = None
    if not (mc or "").startswith("0.19."):
        errors.append(f"megatron-core {mc}; TOP-RL needs 0.19.x")
    for path in argv[1:]:
        for line in open(path):
            m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line.strip())
            if m:
                try:
                    have = md.version(m.group(1))
                except md.PackageNotFoundError:
                    have = None
                if have != m.group(2):
                    errors.append(f"{m.group(1)} is {have}, the base image had {m.group(2)}")
    for e in errors:
        print(f"check_image: {e}", file=sys.stderr)
    if not errors:
        print(f"check_image: ok (Python {sys.version.split()[0]}, sglang {sg}: contract "
              f"{contract.RELEASE_DEFAULTS[sg].name}, megatron-core {mc})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
