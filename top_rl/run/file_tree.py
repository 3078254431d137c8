"""What a directory holds, found without following a single link: its regular files, and every entry that is not
one (a symbolic link, a FIFO, a socket, a device, a regular file with other names: a hard link). A checkpoint and an export hold regular files only, so
verification, `top-rl-export`'s copy and its overwrite check all read a directory through this walk: a link
planted in a checkpoint (to /etc/passwd, to a directory outside the run) is named here, never read.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath


@dataclass
class Tree:
    files: list[str] = field(default_factory=list)  # regular files, relative ("hf/config.json"), sorted
    others: list[tuple[str, str]] = field(default_factory=list)  # (relative name, what it is) of everything else
    dirs: list[str] = field(default_factory=list)  # sub-directories, relative, parents before children


def _what(path: str, mode: int) -> str:
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link (to {os.readlink(path)})"
        except OSError:
            return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device or other special file"


def walk(directory: str | Path) -> Tree:
    """The entries under `directory` (not following links; `directory` itself must be a real directory, which
    the caller checks with `is_link`). OSError (unreadable) propagates to the caller, who names it."""
    tree = Tree()

    def visit(path: str, rel: str) -> None:
        with os.scandir(path) as entries:
            for e in sorted(entries, key=lambda e: e.name):
                name, mode = f"{rel}{e.name}", e.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    tree.dirs.append(name)
                    visit(e.path, name + "/")
                elif stat.S_ISREG(mode) and e.stat(follow_symlinks=False).st_nlink > 1:
                    # a hard link: its other name may lie outside (/etc/shadow); top-rl writes files with one name
                    tree.others.append((name, f"a hard link ({e.stat(follow_symlinks=False).st_nlink} names for one "
                                              "file, the others possibly outside the directory)"))
                elif stat.S_ISREG(mode):
                    tree.files.append(name)
                else:
                    tree.others.append((name, _what(e.path, mode)))

    visit(str(directory), "")
    tree.files.sort()
    return tree


def is_link(path: str | Path) -> str | None:
    """What `path` itself is when it is a symbolic link ("a symbolic link (to X)"), else None."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return _what(str(path), mode) if stat.S_ISLNK(mode) else None


def is_plain_relative(name: object) -> bool:
    """A name like "hf/config.json": relative, normalised, no "..", so it can only name a path inside the directory
    it is relative to (the walk above then decides whether that path is a regular file)."""
    if not isinstance(name, str) or not name or "\0" in name:
        return False
    p = PurePosixPath(name)
    return not p.is_absolute() and str(p) == name and ".." not in p.parts


def open_regular(path: str | Path):
    """`path` opened for reading only if it is a regular file and not a link (O_NOFOLLOW: a link swapped in after
    the walk is refused by the kernel, not followed)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block open
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise OSError(f"{path} is not a regular file")
    return f
