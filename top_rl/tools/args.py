"""One command-line style for every TOP-RL command: `key=value` arguments, the way Hydra reads `top-rl`'s.

`top-rl-export` and `top-rl-parity-probe` are not Hydra apps (no config tree, no run directory to manage),
so they declare their keys here and get the same syntax, `--help`, and errors that name the key and the fix.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


class UsageError(ValueError):
    pass


@dataclass(frozen=True)
class Arg:
    name: str
    help: str
    type: type = str  # str, int, float or bool
    default: Any = None
    required: bool = False
    choices: tuple = ()

    def convert(self, text: str):
        if self.type is bool:
            if text.lower() in _TRUE + _FALSE:
                return text.lower() in _TRUE
            raise UsageError(f"{self.name}={text!r}: expected true or false")
        try:
            value = self.type(text)
        except ValueError:
            raise UsageError(f"{self.name}={text!r}: expected {self.type.__name__}") from None
        if self.choices and value not in self.choices:
            raise UsageError(f"{self.name}={text!r}: expected one of {', '.join(map(str, self.choices))}")
        return value


class KeyValueCli:
    def __init__(self, prog: str, summary: str, args: list[Arg], epilog: str = ""):
        self.prog, self.summary, self.args, self.epilog = prog, summary, {a.name: a for a in args}, epilog

    def usage(self) -> str:
        parts = [f"{a.name}={a.name.upper()}" if a.required else f"[{a.name}=...]" for a in self.args.values()]
        return f"usage: {self.prog} {' '.join(parts)} [--help]"

    def help(self) -> str:
        width = max(len(n) for n in self.args) + 2
        lines = [self.usage(), "", self.summary, "", "keys:"]
        for a in self.args.values():
            default = "required" if a.required else f"default {_show(a.default)}"
            choices = f"; one of {', '.join(map(str, a.choices))}" if a.choices else ""
            lines.append(f"  {a.name:<{width}}{a.help} ({default}{choices})")
        return "\n".join(lines + ([("\n" + self.epilog.strip())] if self.epilog else []))

    def parse(self, argv: list[str]) -> types.SimpleNamespace | None:
        """The parsed keys (defaults filled in), or None when --help / -h was asked (help is printed)."""
        if any(a in ("--help", "-h") for a in argv):
            print(self.help())
            return None
        values: dict[str, Any] = {}
        for a in argv:
            key, eq, text = a.partition("=")
            if a.startswith("-"):
                name = key.lstrip("-").replace("-", "_")
                hint = f"; write {name}=VALUE" if name in self.args else ""
                raise UsageError(f"unexpected option {a!r}: {self.prog} takes key=value arguments{hint}")
            if not eq or key not in self.args:
                raise UsageError(f"unexpected argument {a!r}; keys: {', '.join(self.args)}")
            if key in values:
                raise UsageError(f"{key}= given twice")
            if not text and self.args[key].required:
                raise UsageError(f"{key}= needs a value")
            values[key] = self.args[key].convert(text) if text else self.args[key].default
        missing = [n for n, a in self.args.items() if a.required and n not in values]
        if missing:
            raise UsageError(f"{', '.join(m + '=' for m in missing)} {'is' if len(missing) == 1 else 'are'} required")
        return types.SimpleNamespace(**{n: values.get(n, a.default) for n, a in self.args.items()})


def _show(v) -> str:
    if v is None:
        return "none"
    return str(v).lower() if isinstance(v, bool) else str(v)
