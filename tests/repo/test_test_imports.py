"""The tests import their shared modules one way: as the `tests` package (tests/__init__.py; pyproject.toml puts the
repository root on pytest's sys.path), never by editing sys.path or by a bare name that only resolves when some other
file put tests/ on sys.path first (issue 51: 29 files inserted tests/ into sys.path, each its own way)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def _sys_path_edits(tree: ast.AST) -> list[int]:
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"insert", "append", "extend"} and ast.unparse(node.func.value) == "sys.path"]


def _bare_imports(tree: ast.AST, shared: set[str]) -> list[int]:
    out = []
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        out += [node.lineno for name in names if name and name.split(".")[0] in shared]
    return out


def test_the_check_sees_a_sys_path_edit_and_a_bare_import():
    tree = ast.parse("import sys\nsys.path.insert(0, 'tests')\nimport helpers\nfrom tests.helpers import x\n")
    assert _sys_path_edits(tree) == [2] and _bare_imports(tree, {"helpers"}) == [3]


def test_tests_neither_edit_sys_path_nor_import_shared_modules_by_a_bare_name():
    # what lives in tests/ and in tests/<dir>/ besides test modules (tests/train/common.py, tests/gpu/_common.py ...)
    shared = {p.stem for p in TESTS.rglob("*.py") if not p.name.startswith(("test_", "conftest", "__init__"))}
    shared |= {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    found = {}
    for p in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(p.read_text())
        if lines := _sys_path_edits(tree) + _bare_imports(tree, shared):
            found[p.relative_to(ROOT).as_posix()] = lines
    assert found == {}, f"import these as tests.* (from tests.helpers import ...; from tests import sglang_cpu): {found}"
