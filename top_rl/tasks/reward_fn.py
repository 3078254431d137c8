"""A user's reward function named by the config (`task.reward_fn`): found and imported once, at start, its
signature checked, then called per response (or per step, batched). Every way it can go wrong is one message that
names the key, the function and the fix; a raise or a bad value on a row names that row.

The signature is verl's custom reward function's:
    fn(solution_str, ground_truth, extra_info) -> float                  (task.reward_batched=false)
    fn(solution_strs, ground_truths, extra_infos) -> list[float]         (task.reward_batched=true)
A function that also takes `data_source` (verl's full `compute_score` signature) gets it too (the row's
`data_source` value, else the file's name), and then every argument is passed by name, as verl passes them. A result
may be a number (bool and int included) or verl's dict with a "score" entry.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import sys
from pathlib import Path
from typing import Any, Callable

KEY = "task.reward_fn"
FORM = "'pkg.module:function' or 'path/to/file.py:function'"


class RewardFnError(ValueError):
    """The reward function cannot be used (import, name, signature) or failed on a row."""


def _load_file(path: str, spec: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise RewardFnError(f"{KEY}={spec}: no file {path} (a relative path is read from the working directory "
                            f"{Path.cwd()}); give the file's path, or a module as {FORM}")
    # A name of its own per file, so two reward files called reward.py do not replace each other in sys.modules.
    name = "top_rl_user_reward_" + hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]
    module_spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up there
    module_spec.loader.exec_module(module)
    return module


def load(spec: str, batched: bool) -> Callable:
    """The function `spec` names, imported once; its signature accepts the call `batched` makes."""
    target, sep, fn_name = (spec or "").rpartition(":")
    if not sep or not target or not fn_name:
        raise RewardFnError(f"{KEY}={spec!r} must be {FORM}")
    try:
        if target.endswith(".py") or "/" in target:
            module = _load_file(target, spec)
        else:
            module = importlib.import_module(target)
    except RewardFnError:
        raise
    except ImportError as e:
        raise RewardFnError(f"{KEY}={spec}: cannot import {target!r} ({e}); is its package installed, or did you "
                            "mean a file path ending in .py?") from None
    except Exception as e:  # the module's own code raised while importing
        raise RewardFnError(f"{KEY}={spec}: importing {target} raised {type(e).__name__}: {e}") from None
    fn = getattr(module, fn_name, None)
    if fn is None:
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                         and getattr(v, "__module__", None) == module.__name__)
        raise RewardFnError(f"{KEY}={spec}: {target} has no {fn_name!r}"
                            + (f" (its functions: {', '.join(defined)})" if defined else ""))
    if not callable(fn):
        raise RewardFnError(f"{KEY}={spec}: {fn_name!r} is a {type(fn).__name__}, not a function")
    try:
        sig = inspect.signature(fn)
        if _takes_data_source(fn):
            sig.bind(**_named(fn, batched, "", None, {}, ""))
        else:
            sig.bind("", None, {})
    except TypeError as e:
        form = "(solution_strs, ground_truths, extra_infos)" if batched else "(solution_str, ground_truth, extra_info)"
        raise RewardFnError(f"{KEY}={spec}: {fn_name}{inspect.signature(fn)} cannot be called as {fn_name}{form} "
                            f"({e}); give it that signature"
                            + ("" if batched else ", or set task.reward_batched=true for lists")) from None
    except ValueError:  # a builtin without a signature: it is called and judged on its results
        pass
    return fn


def _takes_data_source(fn: Callable) -> bool:
    try:
        return "data_source" in inspect.signature(fn).parameters or "data_sources" in inspect.signature(fn).parameters
    except ValueError:
        return False


def _named(fn: Callable, batched: bool, solution, ground_truth, extra_info, data_source) -> dict:
    """The arguments by name, as verl passes them to a function that takes data_source."""
    if not batched:
        return {"data_source": data_source, "solution_str": solution, "ground_truth": ground_truth,
                "extra_info": extra_info}
    plural = "data_sources" in inspect.signature(fn).parameters
    return {"data_sources" if plural else "data_source": data_source, "solution_strs": solution,
            "ground_truths": ground_truth, "extra_infos": extra_info}


def call(fn: Callable, spec: str, batched: bool, solutions: list[str], ground_truths: list, extra_infos: list[dict],
         data_sources: list[str], where: list[str]) -> list[float]:
    """fn's rewards for these responses; a raise or a value that is not a finite number is a RewardFnError naming the
    row (`where`: each response's row, e.g. 'data.jsonl:7')."""
    named = _takes_data_source(fn)
    if batched:
        try:
            out = fn(**_named(fn, True, solutions, ground_truths, extra_infos, data_sources)) if named else \
                fn(solutions, ground_truths, extra_infos)
        except Exception as e:
            raise RewardFnError(f"{KEY}={spec} raised {type(e).__name__}: {e} on a batch of {len(solutions)} "
                                f"responses (rows {', '.join(dict.fromkeys(where[:5]))}...)") from None
        try:
            out = list(out)
        except TypeError:
            out = None
        if out is None or len(out) != len(solutions):
            raise RewardFnError(f"{KEY}={spec} (task.reward_batched=true) returned {type(out).__name__ if out is None else len(out)}"
                                f" values for {len(solutions)} responses: return one reward per response")
        return [_score(v, spec, where[i], solutions[i]) for i, v in enumerate(out)]
    rewards = []
    for i, (s, g, x, d) in enumerate(zip(solutions, ground_truths, extra_infos, data_sources)):
        try:
            v = fn(**_named(fn, False, s, g, x, d)) if named else fn(s, g, x)
        except Exception as e:
            raise RewardFnError(f"{KEY}={spec} raised {type(e).__name__}: {e} on row {where[i]} (response "
                                f"{_short(s)}); fix the function, or catch it there and return 0.0") from None
        rewards.append(_score(v, spec, where[i], s))
    return rewards


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _score(v: Any, spec: str, where: str, solution: str) -> float:
    if isinstance(v, dict) and "score" in v:  # verl's reward functions may return {"score": ..., extra metrics}
        v = v["score"]
    if isinstance(v, (int, float)) or (hasattr(v, "item") and getattr(v, "ndim", 1) == 0):
        f = float(v)
        if math.isfinite(f):
            return f
    raise RewardFnError(f"{KEY}={spec} returned {v!r} on row {where} (response {_short(solution)}): a reward must be a "
                        "finite number (or a dict with a 'score' number)")
