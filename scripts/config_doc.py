"""Write docs/config.md: every key of the run config with its type, the default `top-rl` runs with and one line of
meaning, generated from the config dataclasses (top_rl.config.RunConfig and the components' own), never by hand.

    python scripts/config_doc.py > docs/config.md

Types come from the dataclasses' annotations, defaults from the composed default config (`top-rl` with no
overrides; each task from its own task group), meanings from the comment on the field's line in its dataclass, else
the comment lines right above it. tests/repo/test_config_doc.py fails when docs/config.md is not this output, or
when a key has no meaning. A script, not a package module: it composes through top_rl.cli (the entry layer).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import io
import sys
import textwrap
import tokenize
import types
import typing
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from top_rl.cli import compose  # noqa: E402
from top_rl.config import RunConfig  # noqa: E402
from top_rl.tasks import TASKS  # noqa: E402


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> its comment in the class body that declares it (over the MRO, the nearest first)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass.__module__ == "builtins":
            continue
        out.update(_comments_in(klass))
    return out


def _comments_in(klass: type) -> dict[str, str]:
    try:
        src = textwrap.dedent(inspect.getsource(klass))  # a nested class's body too sits at column 4
    except (OSError, TypeError):
        return {}
    names = set(klass.__dict__.get("__annotations__", {}))
    found: dict[str, str] = {}
    line_of_name: dict[int, str] = {}
    for ln, text in enumerate(src.splitlines(), 1):
        stripped = text.strip()
        head = stripped.split(":", 1)[0]
        if text.startswith("    ") and not text.startswith("     ") and head in names and ":" in stripped:
            line_of_name[ln] = head
    trailing: dict[int, str] = {}
    block: dict[int, str] = {}  # comment-only lines at the body's indent: the comment of the field below
    more: dict[int, str] = {}  # comment-only lines indented further: a trailing comment continued
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            ln, text = tok.start[0], tok.string.lstrip("#").strip()
            if not tok.line.strip().startswith("#"):
                trailing[ln] = text
            elif tok.start[1] > 4 or tok.string.startswith("#  "):  # `#    still ...` under a trailing comment
                more[ln] = text
            else:
                block[ln] = text
    for ln, name in line_of_name.items():
        if ln in trailing:
            parts, k = [trailing[ln]], ln + 1
            while k in more:
                parts.append(more[k])
                k += 1
            found[name] = " ".join(parts)
            continue
        above = []
        k = ln - 1
        while k in block:
            above.insert(0, block[k])
            k -= 1
        if above:
            found[name] = " ".join(above)
    return found


def type_name(hint) -> str:
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return " \\| ".join(str(m.value) for m in hint)
    if origin is typing.Literal:
        return " \\| ".join(str(a) for a in typing.get_args(hint))
    if origin in (types.UnionType, typing.Union):
        return " \\| ".join("null" if a is type(None) else type_name(a) for a in typing.get_args(hint))
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(hint))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(hint, "__name__", str(hint)).replace("NoneType", "null")


def value_text(v) -> str:
    if isinstance(v, enum.Enum):
        v = v.value
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):  # quoted where the bare text would hide something (empty, spaces, a newline)
        return json.dumps(v) if v == "" or v != v.strip() or "\n" in v else v
    if isinstance(v, (list, tuple, dict)):
        return repr(list(v) if isinstance(v, tuple) else v)
    return repr(v)


def release_dependent_defaults() -> dict[str, str]:
    """Keys whose default is decided by the SGLang release installed (contract.fallback): the text names each
    release's, so the document is the same whichever release the generating interpreter imports."""
    from top_rl import contract

    per_release = "; ".join(f"{v}: {c.name}" for v, c in contract.RELEASE_DEFAULTS.items())
    return {"top.contract": f"installed: the installed SGLang release's ({per_release})"}


def rows(obj, prefix: str, out: list[tuple[str, str, str, str]], missing: list[str]) -> None:
    cls = type(obj)
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    for f in dataclasses.fields(obj):
        key, value = prefix + f.name, getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            rows(value, key + ".", out, missing)
            continue
        meaning = comments.get(f.name, "")
        if not meaning:
            missing.append(key)
        default = release_dependent_defaults().get(key, value_text(value))
        out.append((key, type_name(hints.get(f.name, type(value))), default, meaning))


def _table(entries) -> list[str]:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, typ, default, meaning in entries:  # a | inside a cell would end it (type names come escaped)
        lines.append(f"| `{key}` | {typ} | `{default}` | {meaning.replace('|', chr(92) + '|')} |")
    return lines


def sections() -> tuple[list[tuple[str, list]], list[str]]:
    """(title, rows) per section (the run's own keys, one per component group, one per task), and the keys that have
    no meaning."""
    cfg = compose([])
    missing: list[str] = []
    run: list = []
    groups = []
    comments, hints = field_comments(RunConfig), typing.get_type_hints(RunConfig)
    for f in dataclasses.fields(RunConfig):
        value = getattr(cfg, f.name)
        if f.name == "task":  # the task group picks a dataclass per task: one section each, below
            continue
        if dataclasses.is_dataclass(value):
            entries: list = []
            rows(value, f.name + ".", entries, missing)
            groups.append((f"`{f.name}`", entries))
        else:
            if not comments.get(f.name):
                missing.append(f.name)
            run.append((f.name, type_name(hints[f.name]), value_text(value), comments.get(f.name, "")))
    tasks = []
    for name in TASKS:
        entries = []
        rows(compose([f"task={name}"], check=False).task, "task.", entries, missing)
        tasks.append((f"`task` (task={name})", entries))
    return [("run", run)] + groups + tasks, missing


def render() -> str:
    secs, _ = sections()
    lines = ["# Configuration keys", "",
             "<!-- Generated by `python scripts/config_doc.py > docs/config.md` from the config dataclasses; do not edit. "
             "tests/repo/test_config_doc.py checks it is current. -->", "",
             "Every key `top-rl` takes (`key=value` on the command line, or in an experiment YAML), with its type, the "
             "value the default job runs with (`top-rl` with no overrides; a task's keys under that task) and what it "
             "means. Enum types list their values. Experiments (`+experiment=NAME`, `top_rl/conf/experiment/`) "
             "change some of these defaults; `top-rl dry_run=true ...` prints a run's resolved config.", ""]
    for title, entries in secs:
        lines += [f"## {title}", ""] + _table(entries) + [""]
    return "\n".join(lines)


def missing_meanings() -> list[str]:
    return sections()[1]


if __name__ == "__main__":
    sys.stdout.write(render())
