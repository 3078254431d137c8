"""No dead private code: a module's private (`_name`) top-level function or class is used in that module. A private
name is the module's own, so one that its module never mentions again is dead, whatever else imports it (issue 51:
attention_flashinfer.py kept a copy of attention.py's two flashinfer entry points that nothing called)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "top_rl"


def _unused_private_definitions(source: str) -> list[str]:
    return [node.name for node in ast.parse(source).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.name.startswith("_") and not node.name.startswith("__")
            and len(re.findall(rf"\b{re.escape(node.name)}\b", source)) < 2]


def test_the_check_finds_a_private_function_nothing_uses():
    assert _unused_private_definitions("def _dead():\n    pass\n\ndef _used():\n    pass\n\nX = _used\n") == ["_dead"]


def test_every_private_top_level_definition_is_used_in_its_module():
    dead = {p.relative_to(PACKAGE.parent).as_posix(): names for p in sorted(PACKAGE.rglob("*.py"))
            if (names := _unused_private_definitions(p.read_text()))}
    assert dead == {}, f"private definitions their module never uses (delete them): {dead}"
