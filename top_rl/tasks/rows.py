"""Rows of a task's data file, whatever its format: (where, row) pairs, `where` naming the file and line (or row
number) so a bad row is reported where the user can find it. Shared by the file-backed tasks (dapo, custom)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from top_rl.tasks.base import MAX_ROW_BYTES, check_regular_file, text_lines

FORMATS = (".jsonl", ".jsonl.gz", ".json", ".parquet")


def read_rows(path: str, max_bytes: int = MAX_ROW_BYTES) -> list[tuple[str, Any]]:
    """(where, row) pairs from .parquet, .jsonl (line by line, a row over `max_bytes` unparsed; .gz too) or .json.
    A row that cannot be parsed comes as a ValueError in its place (the task decides: stop or skip)."""
    check_regular_file(path)  # first: the .json and .parquet readers below would read a device or a FIFO forever
    p = Path(path)
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError(f"{path}: reading parquet needs pyarrow (pip install -e '.[math]', the math extra) "
                              "or a .jsonl copy") from None
        return [(f"{path} row {i}", r) for i, r in enumerate(pq.read_table(p).to_pylist())]
    if p.suffix == ".json":
        try:
            rows = json.loads(p.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text (byte offset {e.start})") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
        return [(f"{path} row {i}", r) for i, r in enumerate(rows if isinstance(rows, list) else [rows])]
    out = []
    for where, line in text_lines(path, max_bytes):
        if isinstance(line, ValueError):
            out.append((where, line))
        elif line.strip():
            try:
                out.append((where, json.loads(line)))
            except json.JSONDecodeError as e:
                out.append((where, ValueError(f"invalid JSON ({e.msg})")))
    return out
