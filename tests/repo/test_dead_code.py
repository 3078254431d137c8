"""No dead code in top_rl/. A module's private (`_name`) top-level function or class is used in that module: a private
name is the module's own, so one its module never mentions again is dead, whatever else imports it (issue 51:
attention_flashinfer.py kept a copy of attention.py's two flashinfer entry points that nothing called). And a public
function or method is named by product code, not by tests alone (issue 51: kernels.set_backend, Trainer.gradients,
Trainer.export_hf_weights were test helpers living in the product)."""

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


# Public definitions no product code names, and why each may stay. A framework calls the hooks by their names; the
# rest are debts (APIs only tests call) named here so no new one slips in: pay one by moving it into the tests (as
# tests/train/common.py's export_hf_weights / gradients / set_lr and tests/helpers.py's use_backend were) or by giving
# it a product caller, then delete its line.
FRAMEWORK_HOOKS = {
    "top_rl/cli.py:SweepPrecheck.on_multirun_start",  # hydra.experimental.callback.Callback
    "top_rl/observe/quiet.py:_DropPrefix.filter",  # logging.Filter
}
TEST_ONLY_DEBTS = {
    "top_rl/contract.py:for_release",
    "top_rl/dtypes.py:DtypePolicy.sample_logprob",
    "top_rl/dtypes.py:DtypePolicy.linear_weight",
    "top_rl/model/qwen3/hf_names.py:megatron_to_hf",
    "top_rl/run/dist_state.py:read_full",
    "top_rl/rollout/sglang/engine.py:SglangEngine.leave_weight_group",  # the live suite's; no run leaves a group yet
    "top_rl/train/optim.py:CpuAdamW.local_grads",
    "top_rl/train/optim.py:GpuAdamW.local_grads",
    "top_rl/train/sequence.py:TrainSequence.from_sample",
}


def _names_used(tree: ast.AST) -> set[str]:
    """Every name a module refers to: variables, attributes, imported names, and identifier strings (getattr)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.add(node.name.rpartition(".")[2])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            out.add(node.value)
    return out


def _public_definitions(path: Path, tree: ast.Module) -> dict[str, str]:
    """'file:name' (or 'file:Class.method') -> the name a caller would use, for the module's public functions."""
    rel, out = path.relative_to(PACKAGE.parent).as_posix(), {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            out[f"{rel}:{node.name}"] = node.name
        elif isinstance(node, ast.ClassDef):
            out |= {f"{rel}:{node.name}.{m.name}": m.name for m in node.body
                    if isinstance(m, ast.FunctionDef) and not m.name.startswith("_")}
    return out


def test_no_public_function_only_tests_call():
    """Product code (top_rl/, bench/, scripts/, the console scripts of pyproject.toml) names every public function
    and method of top_rl/: production code carries no API that only tests call."""
    root = PACKAGE.parent
    trees = {p: ast.parse(p.read_text()) for d in ("top_rl", "bench", "scripts") for p in (root / d).rglob("*.py")}
    used = set().union(*map(_names_used, trees.values()))
    used |= set(re.findall(r'=\s*"top_rl[\w.]*:(\w+)"', (root / "pyproject.toml").read_text()))  # console scripts
    defined = {}
    for p, tree in trees.items():
        if p.is_relative_to(PACKAGE):
            defined |= _public_definitions(p, tree)
    unused = {key for key, name in defined.items() if name not in used}
    assert unused - FRAMEWORK_HOOKS - TEST_ONLY_DEBTS == set(), "move these into tests/ or give them a product caller"
    assert (FRAMEWORK_HOOKS | TEST_ONLY_DEBTS) - unused == set(), "a listed debt was paid: delete its line"
