"""The TOP contract is an argument, never a default (issue 33 item 2): below the entry layer no module reads
`contract.DEFAULT`, no function falls back to a contract when its caller gives none, and the few places that fill in
a contract where nothing names one ask `contract.fallback()` and are listed here."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "top_rl"

# The entry layer decides the run's contract from its config; contract.py defines DEFAULT.
MAY_READ_DEFAULT = {"top_rl/cli.py", "top_rl/preflight.py", "top_rl/contract.py"}
# Where a contract name is filled in when nothing names one, each for a reason a run's call never meets:
FALLBACK_CALLERS = {
    "top_rl/driver/resolution.py",  # top.contract=installed (the default): the installed release's, resolved once
    "top_rl/kernels/plan.py",  # build(): a process with no run config and no $TOP_RL_CONTRACT (a test, a bench)
    "top_rl/tools/parity_probe.py",  # its `contract=` argument left out
    "top_rl/tools/score.py",  # its `--contract` left out
    "top_rl/tools/doctor.py",  # its `contract=` left out: the installed release's (no run, nothing is started)
}


def _code_only(text: str) -> str:
    """`text` without comments and strings: a docstring may name contract.DEFAULT, code may not."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.STRING):
            out.append(tok.string)
    return " ".join(out)


def default_reads(text: str) -> list[str]:
    """Every read of top_rl.contract's DEFAULT in `text`: as an attribute of the module under any name it is bound to,
    imported by name, or spelled out in code."""
    tree = ast.parse(text)
    aliases = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == "top_rl.contract" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "top_rl":
            aliases |= {a.asname or a.name for a in node.names if a.name == "contract"}
        elif isinstance(node, ast.ImportFrom) and node.module == "top_rl.contract":
            found += [f"line {node.lineno}: from top_rl.contract import DEFAULT" for a in node.names if a.name == "DEFAULT"]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "DEFAULT" and isinstance(node.value, ast.Name) \
                and node.value.id in aliases:
            found.append(f"line {node.lineno}: {node.value.id}.DEFAULT")
    if re.search(r"\bcontract\s*\.\s*DEFAULT\b", _code_only(text)) and not found:
        found.append("contract.DEFAULT")  # e.g. top_rl.contract.DEFAULT, or getattr spelled out
    return found


def contract_defaults(text: str) -> list[str]:
    """Parameters annotated as a TopContract whose default is not None (`top=contract.DEFAULT`, `top=V1`, ...)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = node.args
        pos = args.posonlyargs + args.args
        pairs = list(zip(pos[len(pos) - len(args.defaults):], args.defaults))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        for arg, default in pairs:
            if arg.annotation is not None and "TopContract" in ast.unparse(arg.annotation) \
                    and not (isinstance(default, ast.Constant) and default.value is None):
                found.append(f"{node.name}({arg.arg}={ast.unparse(default)}) line {node.lineno}")
    return found


def _package_files():
    for p in sorted(PACKAGE.rglob("*.py")):
        yield p.relative_to(ROOT).as_posix(), p.read_text()


def test_no_default_contract_below_the_entry_layer():
    bad = {rel: hits for rel, text in _package_files() if rel not in MAY_READ_DEFAULT
           for hits in [default_reads(text)] if hits}
    assert not bad, f"read the run's contract (an argument, or the installed KernelPlan's), not contract.DEFAULT: {bad}"


def test_no_function_defaults_its_contract():
    bad = {rel: hits for rel, text in _package_files() for hits in [contract_defaults(text)] if hits}
    assert not bad, f"a TopContract parameter takes the caller's contract, never a default: {bad}"


def test_fallback_is_asked_only_where_nothing_names_a_contract():
    callers = {rel for rel, text in _package_files() if re.search(r"\bfallback\s*\(", _code_only(text))
               and rel != "top_rl/contract.py" and "contract" in text}
    assert callers <= FALLBACK_CALLERS, f"new callers of contract.fallback(): {sorted(callers - FALLBACK_CALLERS)}"


def test_the_checks_find_what_they_forbid():
    """The checkers above are not vacuous: each finds the forms it forbids, and passes what is allowed."""
    assert default_reads("from top_rl import contract\nx = contract.DEFAULT\n")
    assert default_reads("from top_rl import contract as _c\nx = _c.DEFAULT.name\n")
    assert default_reads("from top_rl.contract import DEFAULT\n")
    assert default_reads("import top_rl.contract as tc\ny = tc.DEFAULT\n")
    assert default_reads("import top_rl\ny = top_rl.contract.DEFAULT\n")
    assert not default_reads("from top_rl import contract\n# contract.DEFAULT in a comment\nx = contract.get(n)\n")
    assert not default_reads('"""contract.DEFAULT in a docstring"""\nfrom top_rl.model import family\nx = family.DEFAULT\n')
    assert contract_defaults("def f(cfg, top: contract.TopContract = contract.DEFAULT): pass\n")
    assert contract_defaults("def f(cfg, *, top: 'TopContract' = V1): pass\n")
    assert not contract_defaults("def f(cfg, top: contract.TopContract): pass\n")
    assert not contract_defaults("def f(cfg, top: contract.TopContract | None = None): pass\n")
