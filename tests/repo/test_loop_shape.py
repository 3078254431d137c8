"""loop.run tells the RL step's story and nothing else (issue 51): the order of rollouts and weight pushes is the
schedule's (top_rl.driver.schedule), each step's parts live with their owners. This keeps it from growing back."""

from __future__ import annotations

import ast
import re
from pathlib import Path

LOOP = Path(__file__).resolve().parents[2] / "top_rl" / "loop.py"
MAX_LINES, MAX_CONDITIONALS, MAX_LAG_MENTIONS = 80, 8, 2


def _run_function() -> tuple[ast.FunctionDef, str]:
    source = LOOP.read_text()
    tree = ast.parse(source)
    run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    return run, ast.get_source_segment(source, run)


def conditionals(fn: ast.AST) -> int:
    """Branches: if/elif, while, a ternary, and/or used as a branch, a comprehension's if."""
    count = 0
    for node in ast.walk(fn):
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            count += 1
        elif isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            count += len(node.ifs)
    return count


def test_the_counter_counts_every_kind_of_branch():
    fn = ast.parse("def f(a, b):\n    if a:\n        pass\n    elif b:\n        pass\n    while a and b or a:\n"
                   "        a = 1 if b else 2\n    return [x for x in a if x]\n")
    assert conditionals(fn) == 2 + 1 + 2 + 1 + 1


def test_loop_run_is_short_straight_and_does_not_know_the_lag():
    run, text = _run_function()
    lines = run.end_lineno - run.lineno + 1
    assert lines <= MAX_LINES, f"loop.run is {lines} lines (at most {MAX_LINES}): move the detail to its owner"
    assert conditionals(run) <= MAX_CONDITIONALS, f"loop.run has {conditionals(run)} branches (at most 8)"
    mentions = len(re.findall(r"lag", text, flags=re.IGNORECASE))
    assert mentions <= MAX_LAG_MENTIONS, f"loop.run mentions the lag {mentions} times: the order is the schedule's"
