"""Render launch/slurm.sbatch.template into an sbatch script (docs/cluster.md):

    python launch/slurm_render.py nodes=2 gpus_per_node=8 run_dir=/shared/runs/dapo time=24:00:00 \
        -- +experiment=dapo_qwen3_4b model.path=/shared/models/Qwen3-4B > dapo.sbatch && sbatch dapo.sbatch

Refused, in one line naming the key: a run_dir that is not absolute (it must be the same path on every node; a
relative one would resolve in the head's job directory), nodes or gpus_per_node below 1, a run_dir= among the
overrides (give it as the key), a field that would break the script (quotes, newlines).
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "slurm.sbatch.template"
KEYS = {"nodes": None, "gpus_per_node": "8", "run_dir": None, "time": "24:00:00", "job_name": "top-rl",
        "launch_dir": str(HERE)}


class RenderError(ValueError):
    pass


def render(values: dict[str, str], overrides: list[str]) -> str:
    missing = [k for k, d in KEYS.items() if d is None and not values.get(k)]
    if missing:
        raise RenderError(f"{', '.join(m + '=' for m in missing)} required")
    v = {**{k: d for k, d in KEYS.items() if d is not None}, **values}
    for key in ("nodes", "gpus_per_node"):
        if not re.fullmatch(r"[1-9][0-9]*", v[key]):
            raise RenderError(f"{key}={v[key]!r}: a whole number >= 1")
    if not v["run_dir"].startswith("/"):
        raise RenderError(f"run_dir={v['run_dir']!r} is not absolute: give the path every node mounts it at "
                          "(a relative one would resolve in the head's job directory)")
    if not re.fullmatch(r"[0-9:-]+", v["time"]) or not re.fullmatch(r"[A-Za-z0-9_.-]+", v["job_name"]):
        raise RenderError(f"time={v['time']!r} / job_name={v['job_name']!r}: Slurm's D-HH:MM:SS and a plain name")
    if any(o.startswith("run_dir=") for o in overrides):
        raise RenderError("run_dir= among the overrides: give it as the run_dir key (the script passes it last)")
    if any(re.search(r"[\n\r]", x) for x in [*v.values(), *overrides]):
        raise RenderError("a value holds a newline")
    if not overrides:
        raise RenderError("no run overrides after --: e.g. -- +experiment=dapo_qwen3_4b")
    fields = {k.upper(): shlex.quote(x) for k, x in v.items()}
    fields["OVERRIDES"] = " ".join(shlex.quote(o) for o in overrides)
    fields["NODES"], fields["GPUS_PER_NODE"], fields["TIME"], fields["JOB_NAME"] = (
        v["nodes"], v["gpus_per_node"], v["time"], v["job_name"])
    out = re.sub(r"\{\{([A-Z_]+)\}\}", lambda m: fields[m.group(1)], TEMPLATE.read_text())
    return out


def main(argv: list[str]) -> int:
    keys, overrides = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    values = {}
    try:
        for a in keys:
            k, eq, x = a.partition("=")
            if not eq or k not in KEYS:
                raise RenderError(f"unexpected argument {a!r}; keys: {', '.join(k + '=' for k in KEYS)}, then -- "
                                  "and the run's overrides")
            values[k] = x
        sys.stdout.write(render(values, overrides))
    except RenderError as e:
        print(f"slurm_render: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
