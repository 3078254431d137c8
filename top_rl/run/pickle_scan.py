"""Which Python objects a pickle names, read without unpickling it.

`torch.load(weights_only=True)` refuses any object outside its allowlist, but a checkpoint must also be *refused by
name* before it is loaded (top_rl.run.safe_load): torch's own static scan (`get_unsafe_globals_in_checkpoint`) reads only
the GLOBAL opcode and stops with "Unsupported operand" at anything else, so a payload that names its callable another
way (STACK_GLOBAL on strings from the memo, INST, a copyreg extension code) or a legacy non-zip `torch.save` file came out
as "unreadable", not as the object it names. This reads every opcode (pickletools, which only parses) and follows the
stack far enough to name what STACK_GLOBAL would import: the strings it takes, pushed directly, duplicated or fetched
from the memo. A name built some other way cannot be known without running the pickle: it is reported as such, which
is a refusal too.
"""

from __future__ import annotations

import _compat_pickle
import pickletools
from typing import BinaryIO

_MARK = object()  # MARK's place on the simulated stack
_ANY = object()  # any value whose content does not matter here
_STRING_ARGS = {"str", "bytes_or_str"}  # stack_after of the opcodes that push their (string) argument
_GET = {"GET", "BINGET", "LONG_BINGET"}
_PUT = {"PUT", "BINPUT", "LONG_BINPUT"}
_EXT = {"EXT1", "EXT2", "EXT4"}


class PickleUnreadable(ValueError):
    """The stream is not a whole pickle (truncated, or bytes that are no pickle opcode)."""


def named_objects(stream: BinaryIO, pickles: int = 1) -> tuple[list[str], str | None]:
    """The objects (`module.name`) the next `pickles` pickles in `stream` would import, in order, and why the stream
    could not be read to their end (None when it could). Names found before a damaged part still count: an unpickler
    would have imported them before reaching it."""
    names: list[str] = []
    try:
        for _ in range(pickles):
            _scan_one(stream, names)
    except PickleUnreadable as e:
        return names, str(e)
    return names, None


def _scan_one(stream: BinaryIO, names: list[str]) -> None:
    stack: list = []
    memo: dict[int, object] = {}

    proto = 0

    def name(found: str) -> None:
        if found not in names:
            names.append(found)

    def python3_name(module: str, attr: str) -> str:  # what the unpickler imports (fix_imports, protocols 0-2)
        if proto < 3:
            module, attr = _compat_pickle.NAME_MAPPING.get((module, attr),
                                                           (_compat_pickle.IMPORT_MAPPING.get(module, module), attr))
        return f"{module}.{attr}"

    def pop(n: int) -> list:
        if n > len(stack):
            raise PickleUnreadable(f"stack underflow at byte {pos}")
        taken = stack[len(stack) - n:]
        del stack[len(stack) - n:]
        return taken

    pos = 0
    try:
        for op, arg, pos in pickletools.genops(stream):
            kind = op.name
            if kind == "PROTO":
                proto = int(arg)
            elif kind in ("GLOBAL", "INST"):  # arg "module name"
                name(python3_name(*str(arg).split(" ", 1)))
            elif kind == "STACK_GLOBAL":
                module, attr = pop(2)
                if isinstance(module, str) and isinstance(attr, str):
                    name(python3_name(module, attr))
                else:
                    name(f"<an object whose name is computed while unpickling (STACK_GLOBAL at byte {pos})>")
                stack.append(_ANY)
                continue
            elif kind in _EXT:
                name(f"<copyreg extension code {arg} (byte {pos})>")
            if kind == "MARK":
                stack.append(_MARK)
            elif kind in _PUT or kind == "MEMOIZE":  # store the top without popping it
                if not stack:
                    raise PickleUnreadable(f"{kind} on an empty stack at byte {pos}")
                memo[len(memo) if kind == "MEMOIZE" else int(arg)] = stack[-1]
            elif kind in _GET:
                stack.append(memo.get(int(arg), _ANY))
            elif kind == "DUP":
                stack.append(stack[-1] if stack else _ANY)
            else:
                before = [s.name for s in op.stack_before]
                if "stackslice" in before:  # everything down to the topmost MARK, then what lies under it
                    if _MARK not in stack:
                        raise PickleUnreadable(f"{kind} without a MARK at byte {pos}")
                    at = len(stack) - 1 - stack[::-1].index(_MARK)
                    del stack[at:]
                    pop(before.index("mark"))
                else:
                    pop(len(before))
                after = [s.name for s in op.stack_after]
                if after and after[0] in _STRING_ARGS and isinstance(arg, str):
                    stack.append(arg)
                else:
                    stack.extend(_ANY for _ in after)
    except PickleUnreadable:
        raise
    except ValueError as e:  # pickletools: an unknown opcode, a truncated argument, the end before STOP
        raise PickleUnreadable(f"not a whole pickle past byte {pos} ({e})") from None
