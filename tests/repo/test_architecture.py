"""The package's shape, as docs/architecture.md draws it: imports run one way (down the layers below), no import
circle, a small top level, small files, and the environment read in one place."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "top_rl"

# Lowest first. A module may import its own layer's modules and anything below, never above. Each layer is one step
# of the longest import chain (config/ and the plain-data files stand on the ground; cli.py on the eighth step).
LAYERS = [
    {"config", "sglang_release", "dtypes", "atomic"},  # the run config's schema (it imports nothing else), plain data
    {"contract", "rl", "tasks"},  # the TOP contract; RL math and the gate; tasks and their prompt streams
    {"kernels", "engine"},  # the engine's ops; what every rollout engine is to the rest (engine/interface.py)
    {"model", "observe", "eval"},  # models over the kernels; metrics, wandb; the eval pass (through the cluster)
    {"train", "rollout", "weights", "run"},  # the two sides; trainer -> engine weight transport; a run on disk
    {"driver", "tools", "config_checks"},  # Ray: placement, actors, cluster; export, probes; the config's value checks
    {"preflight", "loop"},  # every refusal before anything starts; the RL loop over what preflight produced
    {"cli"},  # entry points: the checks, then the loop
]
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}
MAX_TOP_LEVEL = 8
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(path: Path, mods: dict[str, Path]) -> set[str]:
    """top_rl modules `path` imports (anywhere in the file, function bodies too)."""

    def resolve(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {resolve(a.name) for a in node.names if a.name.split(".")[0] == "top_rl"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "top_rl":
            for a in node.names:
                full = f"{node.module}.{a.name}"
                found.add(full if full in mods else resolve(node.module))
    return found - {"top_rl"}


def _layer(module: str) -> int:
    return LAYER_OF[module.split(".")[1]]


def test_every_part_of_the_package_has_a_layer():
    mods = _modules()
    assert sorted({m.split(".")[1] for m in mods if m != "top_rl"} - LAYER_OF.keys()) == []


def test_imports_run_down_the_layers():
    mods = _modules()
    upward = [f"{m} (layer {_layer(m)}) imports {d} (layer {_layer(d)})"
              for m, p in sorted(mods.items()) if m != "top_rl"
              for d in sorted(_imports(p, mods)) if _layer(d) > _layer(m)]
    assert upward == []


def test_no_import_circle():
    mods = _modules()
    graph = {m: _imports(p, mods) - {m} for m, p in mods.items()}
    # a package's __init__ importing its own modules is not a circle of two concerns
    graph = {m: {d for d in ds if not d.startswith(m + ".")} for m, ds in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert circles == []


def test_weights_reach_engines_only_through_the_protocol():
    """top_rl.weights sees an engine only as top_rl/engine/interface.py's EngineWeights: it imports nothing of
    top_rl.rollout (no engine, and not the engines' package), so a transport can call nothing an engine has beyond the
    protocol, and touches no engine actor's attributes (the actor's one weight door hands each request to the
    transport's receiving end)."""
    mods = _modules()
    reached = sorted(f"{m} imports {d}" for m, p in mods.items() if m.startswith("top_rl.weights")
                     for d in _imports(p, mods) if d.startswith("top_rl.rollout"))
    assert reached == []
    by_name = sorted(f"{p.relative_to(ROOT)}: actor.{n.attr}" for p in (PACKAGE / "weights").rglob("*.py")
                     for n in ast.walk(ast.parse(p.read_text()))
                     if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "actor")
    assert by_name == []


def test_rollout_keeps_a_small_top_level():
    """Engines are packages (rollout/native/, rollout/sglang/) beside the interface and the settings they share."""
    top = sorted(p.name for p in (PACKAGE / "rollout").iterdir() if p.name != "__pycache__")
    assert len(top) <= 6, top


def test_the_top_level_keeps_only_entry_points_and_plain_data():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top


def test_no_file_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_test_doubles_do_not_ship():
    assert not (PACKAGE / "testing").exists()
    shipped = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py") if re.search(r"stand-?in server", p.stem)]
    assert shipped == []


# The one reader of TOP_RL_* kernel switches is the KernelPlan builder; the fault hook is test-only (TOP_RL_FAULT, set
# by the fault tests to kill a process at a named point), never a config switch. Other variables the package reads
# (SGLANG_* contract checks, CUDA_VISIBLE_DEVICES, GLOO_SOCKET_IFNAME, WANDB_*, RAY_ADDRESS) are not TOP-RL settings.
# The driver's watcher marks a local run's processes with TOP_RL_LOCAL_RUN (set, never read as a setting).
TOP_RL_ENV_READERS = {"top_rl/kernels/plan.py", "top_rl/run/fault_injection.py", "top_rl/driver/leftovers.py"}


def top_rl_env_readers(package: Path) -> list[str]:
    """Files under `package` that touch the process environment and name a TOP_RL_* variable in code."""
    found = []
    for p in sorted(package.rglob("*.py")):
        tree = ast.parse(p.read_text())
        env = any(isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv") and isinstance(n.value, ast.Name)
                  and n.value.id == "os" for n in ast.walk(tree)) or any(
            isinstance(n, ast.ImportFrom) and n.module == "os" and {a.name for a in n.names} & {"environ", "getenv"}
            for n in ast.walk(tree))
        named = any(isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("TOP_RL_")
                    for n in ast.walk(tree))
        if env and named:
            found.append(str(p.relative_to(package.parent)))
    return found


def test_top_rl_variables_are_read_only_by_the_kernel_plan_builder():
    assert sorted(set(top_rl_env_readers(PACKAGE)) - TOP_RL_ENV_READERS) == []



def test_the_config_imports_nothing_outside_itself():
    """top_rl/config/ is the schema: every section is plain data in a module of its own, and it imports no other
    top_rl module (no contract, kernel, engine, driver, run or observe code), so it stands on the ground floor, below
    everything that reads it; each component imports its section from here."""
    mods = _modules()
    reached = {d for m, p in mods.items() if m == "top_rl.config" or m.startswith("top_rl.config.")
               for d in _imports(p, mods)}
    assert sorted(d for d in reached if not (d == "top_rl.config" or d.startswith("top_rl.config."))) == []
    assert _layer("top_rl.config") == 0 < _layer("top_rl.driver") < _layer("top_rl.preflight")
    # and at run time: importing it loads no other part of the package
    code = "import sys, top_rl.config; print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('top_rl.')}))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert set(eval(loaded)) == {"config"}


def test_the_loop_takes_what_preflight_produced():
    """loop.py imports no entry module (preflight, config_checks, cli): the cli runs the checks and hands the loop
    what they loaded and the plan, so the loop and the checks stand side by side."""
    mods = _modules()
    entry = {"top_rl.preflight", "top_rl.config_checks", "top_rl.cli"}
    assert sorted(_imports(mods["top_rl.loop"], mods) & entry) == []
