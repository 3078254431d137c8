"""Every node with a trainer rank must see the driver's run_dir (issue 53 item 4).

Each trainer rank writes its checkpoint shard under run_dir and the driver hashes those shards into the manifest, so
run_dir must be one directory on a filesystem every node mounts at the same path. A node that does not (a node-local
/tmp, a relative path resolved in another working directory) would write its shards where no one reads them, and the
run would fail at its first checkpoint, or, worse, resume from a stale one. So before any rank builds its model the
driver writes a random token into run_dir and every rank reads it back from the same path; a rank that cannot, or
reads another token, stops the run, naming its node. Local runs pass trivially (same machine).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

TOKEN_FILE = ".top-rl-shared-check"


class RunDirNotShared(RuntimeError):
    """run_dir is not the same directory on every node with a trainer rank; the message names the nodes."""


def write_token(run_dir: str | Path) -> str:
    """A fresh random token, written to run_dir (which the run lock has created) for the ranks to read."""
    token = secrets.token_hex(16)
    path = Path(run_dir) / TOKEN_FILE
    tmp = path.with_name(TOKEN_FILE + f".{os.getpid()}.tmp")
    tmp.write_text(token)
    os.replace(tmp, path)
    return token


def remove_token(run_dir: str | Path) -> None:
    (Path(run_dir) / TOKEN_FILE).unlink(missing_ok=True)


def read_token(run_dir: str | Path, token: str) -> str | None:
    """On a rank's node: None when run_dir holds the driver's token, else what this node sees instead."""
    path = Path(run_dir) / TOKEN_FILE
    try:
        have = path.read_text().strip()
    except FileNotFoundError:
        return f"{path} does not exist there" if Path(run_dir).is_dir() else f"{run_dir} does not exist there"
    except OSError as e:
        return f"{path} cannot be read there ({e.strerror or e})"
    return None if have == token else f"{path} holds another token there (another directory at the same path)"


def refusal(run_dir: str | Path, answers: list[tuple[int, str, str | None]]) -> str | None:
    """The one-line refusal for the ranks' (rank, node, what it saw) answers; None when every rank saw the token."""
    bad = [(r, node, why) for r, node, why in answers if why]
    if not bad:
        return None
    where = "; ".join(f"trainer rank {r} on node {node}: {why}" for r, node, why in bad)
    return (f"run_dir={run_dir} is not the same directory on every node with a trainer rank ({where}): each rank "
            "writes its checkpoint shard there, so put run_dir on a filesystem every node mounts at the same path "
            "(NFS, Lustre, ...; docs/cluster.md)")
