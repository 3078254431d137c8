"""docs/config.md is the output of scripts/config_doc.py (generated from the config dataclasses), every key in it has
a meaning, and every key of the composed config is in it."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

from scripts import config_doc

ROOT = Path(__file__).resolve().parents[2]


def test_docs_config_md_is_current():
    have = (ROOT / "docs" / "config.md").read_text()
    assert have == config_doc.render(), ("docs/config.md is stale: run `python scripts/config_doc.py > docs/config.md` "
                                         "(a config dataclass, its comments or a default changed)")


def test_every_key_has_a_meaning():
    assert config_doc.missing_meanings() == [], "give these config fields a comment in their dataclass"


def test_every_composed_key_is_listed():
    from top_rl.cli import compose

    def keys(obj, prefix=""):
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            yield from keys(v, f"{prefix}{f.name}.") if dataclasses.is_dataclass(v) else [prefix + f.name]

    listed = set(re.findall(r"^\| `([^`]+)` \|", (ROOT / "docs" / "config.md").read_text(), re.M))
    for task in ("arith", "gsm8k", "dapo"):
        assert set(keys(compose([f"task={task}"]))) <= listed
    assert set(keys(compose(["task=custom"], check=False))) <= listed  # its path and reward_fn are required


def test_the_comment_reader_finds_each_form():
    @dataclasses.dataclass
    class Example:
        a: int = 1  # trailing
        # above, first line
        # and its second
        b: int = 2
        c: int = 3  # a trailing comment
        #           continued on the next line
        d: int = 4

    assert config_doc.field_comments(Example) == {"a": "trailing", "b": "above, first line and its second",
                                                  "c": "a trailing comment continued on the next line"}


def test_the_script_prints_the_document():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "config_doc.py")], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (ROOT / "docs" / "config.md").read_text()
