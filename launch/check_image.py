"""Check that this environment is the one TOP-RL's contract was written for (run by the Dockerfile's build;
useful on any GPU node):
    python launch/check_image.py [constraints.txt ...] [--lock LOCK --before FREEZE]

Checks: Python 3.12, an sglang release with a TOP contract (top_rl/sglang_release/: 0.5.11, 0.5.17), megatron-core 0.19.x, top_rl importable, (given the
constraints file written from the base image) that no install changed the image's CUDA stack, and (given the lock and
the base image's `pip freeze`) that every package the build installed or changed is pinned, at that version, by the
lock or the constraints: an unpinned package is one that floats from one build to the next.
"""

import importlib.metadata as md
import re
import sys


def _pins(path: str) -> dict[str, str]:
    out = {}
    for line in open(path):
        m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if m:
            out[_norm(m.group(1))] = m.group(2)
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.lower())


def unpinned(installed: dict[str, str], before: dict[str, str], pinned: dict[str, str]) -> list[str]:
    """Each package whose version differs from the base image's (new or changed) without a pin at that version."""
    return [f"{n}=={v}" for n, v in sorted(installed.items())
            if before.get(n) != v and n != "top-rl" and pinned.get(n) != v]


def main(argv: list[str]) -> int:
    from top_rl import contract, sglang_release

    lock = before = None
    args = argv[1:]
    for flag in ("--lock", "--before"):
        if flag in args:
            i = args.index(flag)
            if flag == "--lock":
                lock = args[i + 1]
            else:
                before = args[i + 1]
            del args[i:i + 2]
    argv = argv[:1] + args
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
    if lock and before:
        pinned = _pins(lock)
        for path in argv[1:]:
            pinned.update(_pins(path))
        installed = {_norm(d.metadata["Name"]): d.version for d in md.distributions()}
        for p in unpinned(installed, _pins(before), pinned):
            errors.append(f"{p} was installed by the build but {lock} does not pin it: "
                          "regenerate the lock (python scripts/docker_lock.py <release>)")
    for e in errors:
        print(f"check_image: {e}", file=sys.stderr)
    if not errors:
        print(f"check_image: ok (Python {sys.version.split()[0]}, sglang {sg}: contract "
              f"{contract.RELEASE_DEFAULTS[sg].name}, megatron-core {mc})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
