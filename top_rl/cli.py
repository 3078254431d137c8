"""Entry points, all taking `key=value` arguments and `--help`: `top-rl [hydra overrides]` (`-m` sweeps),
`top-rl doctor [contract=NAME]` (top_rl/tools/doctor.py),
`top-rl-export run_dir=... out=DIR`, `top-rl-parity-probe url=... model=DIR`,
`top-rl-convert-checkpoint run_dir=...` (top_rl/tools/args.py)."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import signal
import sys
from pathlib import Path

from hydra.experimental.callback import Callback

from top_rl.observe import quiet
from top_rl.observe.startup import imports_without_gc

CONF_DIR = str(Path(__file__).resolve().parent / "conf")  # package data: ships in the wheel


# Hydra's own settings for `top-rl`, carried by the schema node that the config's defaults list starts with.
# The app is named after the command (Hydra would name it after this file, "cli"), and a multirun
# (`top-rl -m steps=1,2`) puts job N's run_dir at <run_dir>/N instead of sharing run_dir and writing
# ./multirun/DATE/TIME into the working directory; before its first job starts, SweepPrecheck checks every job.
HYDRA_SETTINGS = {
    "job": {"name": "top-rl"},
    "sweep": {"dir": "${run_dir}", "subdir": "${hydra.job.num}"},
    "callbacks": {"sweep_precheck": {"_target_": "top_rl.cli.SweepPrecheck"}},
    "help": {"header": "${hydra.help.app_name}: true on-policy RL for dense Qwen3 (trainer log-probs bitwise equal to "
                       "the rollout engine's).\n\nusage: ${hydra.help.app_name} [key=value ...]     one run, in run_dir"
                       "\n       ${hydra.help.app_name} -m [key=a,b ...]    a sweep: job N runs in <run_dir>/N\n"},
}


def _register_schema() -> None:
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf, open_dict

    from top_rl.config import RunConfig

    from top_rl.tasks import TASKS, load_plugin_tasks

    shipped = set(TASKS)
    store = ConfigStore.instance()
    # Each task group file starts from its dataclass (`- /NAME_task_schema@_here_`): kept out of the task group, so
    # `--help` lists only the tasks as its choices (a schema is not one).
    for name, (task_config, _) in load_plugin_tasks().items():
        store.store(name=f"{name}_task_schema", node=task_config)
        if name not in shipped:  # another package's task (entry point): no yaml, its dataclass is the option
            store.store(group="task", name=name, node=task_config)
    node = OmegaConf.structured(RunConfig)
    with open_dict(node):
        node.hydra = HYDRA_SETTINGS
    ConfigStore.instance().store(name="run_schema", node=node)


def _job_run_dir(dict_cfg) -> None:
    """In a multirun, each job's run_dir is its own directory under the sweep's (see HYDRA_SETTINGS)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import open_dict

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        with open_dict(dict_cfg):
            dict_cfg.run_dir = hydra_cfg.runtime.output_dir


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def _sweep_jobs(config) -> list[list[str]]:
    """Each job's overrides, as Hydra's basic sweeper will make them (its sweeper.params, then the command line's)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    task = list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    return [job for batch in BasicSweeper.split_arguments(parser.parse_overrides(params + task), None) for job in batch]


def _sweep_job_config(config, num: int, overrides: list[str]):
    """Job `num`'s RunConfig, composed as Hydra's basic launcher will compose it, its run_dir <sweep dir>/<num>
    (run_dir itself when that is empty, which validate refuses: Hydra would put the jobs in the working directory)."""
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from top_rl.config import from_hydra

    job = GlobalHydra.instance().config_loader().load_sweep_config(config, overrides)
    with open_dict(job):
        job.hydra.job.id = job.hydra.job.num = num
        sweep_dir = str(job.hydra.sweep.dir)
        run_dir = os.path.abspath(os.path.join(sweep_dir, str(job.hydra.sweep.subdir))) if sweep_dir.strip() else sweep_dir
        del job["hydra"]
        job.run_dir = run_dir
    return from_hydra(job)


def sweep_refusal(config) -> tuple[str, int] | None:
    """The first job of the sweep `config` (Hydra's multirun config) that the checks a config alone decides refuse
    (top_rl.preflight.SWEEP_CHECKS; CONFIG_CHECKS for a dry run, as a dry run itself): its message and exit code; None
    when every job passes."""
    from hydra.errors import CompactHydraException

    from top_rl.preflight import CONFIG_CHECKS, REFUSALS, SWEEP_CHECKS, check

    if config.hydra.sweeper.get("_target_") != BASIC_SWEEPER:  # another sweeper plugin makes its jobs its own way
        return None
    jobs = _sweep_jobs(config)
    for num, overrides in enumerate(jobs):
        try:
            cfg = _sweep_job_config(config, num, overrides)
            check(cfg, CONFIG_CHECKS if cfg.dry_run else SWEEP_CHECKS)  # dry_run=true alone checks only the config
        except (CompactHydraException, *REFUSALS) as e:
            why = hydra_error_line(e) if isinstance(e, CompactHydraException) else str(e)
            swept = [o for i, o in enumerate(overrides) if len({job[i] for job in jobs}) > 1] or overrides
            return (f"sweep refused before any job started: job {num} ({' '.join(swept)}): {why}",
                    2 if isinstance(e, CompactHydraException) else getattr(e, "exit_code", 1))
    return None


class SweepPrecheck(Callback):
    """`top-rl -m`: every job's config is composed and checked before the first job starts, so a bad value in the
    last job costs no run of the first ones. Hydra calls this before it creates the sweep's directory and its
    multirun.yaml, so a refused sweep leaves nothing behind. (A Hydra callback: hydra.callbacks, HYDRA_SETTINGS.)"""

    def on_multirun_start(self, config, **kwargs) -> None:
        refused = sweep_refusal(config)
        if refused:
            print(f"top-rl: {refused[0]}", file=sys.stderr, flush=True)
            sys.exit(refused[1])


def compose(overrides: list[str], check: bool = True):
    """The validated RunConfig for these overrides (tests and tools; `main` goes through @hydra.main, and its run
    validates once, in preflight). check=False: composed and typed, its values unchecked (the config's documentation
    lists a task's defaults even where the task requires a key, task=custom's path)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from top_rl.config import from_hydra
    from top_rl.config_checks import validate
    from top_rl.driver import resolution

    from hydra.errors import CompactHydraException

    from top_rl.config import ConfigError

    from top_rl.config import removed

    if removed.refusal(overrides):
        raise ConfigError(removed.refusal(overrides))
    _register_schema()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        try:
            composed = hydra_compose(config_name="config", overrides=overrides)
        except CompactHydraException as e:  # an enum-typed key's bad value, an unknown key: name it
            raise ConfigError(hydra_error_line(e)) from None
        cfg = from_hydra(composed)
        if not check:
            return cfg
        # resolved as a run's preflight resolves it (its first check: the contract, `auto`), so it validates as it would
        try:
            resolution.resolve(cfg)
        except resolution.Unresolvable as e:
            raise ConfigError(f"invalid config: {e}") from None
        return validate(cfg)


def hydra_error_line(e: BaseException) -> str:
    """Hydra's message for an override it cannot compose (an unknown key, a value of the wrong type, a group
    option that does not exist, a syntax error), in one line: each part's first line(s), without the detail
    lines (full_key, object_type) that name Python types."""
    parts: list[str] = []
    for err in (e, e.__cause__):
        listing = False  # inside the indented list under "Available options in '<group>':"
        for line in str(err or "").splitlines():
            text, indented = line.strip(), line.startswith((" ", "\t"))
            if text.startswith("Config search path"):
                break
            if listing and indented:
                if not text.endswith("_schema"):  # the typed schemas the groups extend: not choices
                    parts[-1] += ("" if parts[-1].endswith(":") else ",") + " " + text
            elif text and not indented and text not in parts:
                listing = text.startswith("Available options")
                parts.append(text)
    return "invalid config: " + " ".join(parts)


def launch_plan(cfg, resolution=None) -> dict:
    """What `dry_run=true` prints: engines (with full commands for SGLang), trainer layout, contract, Ray; `resolution`:
    the run's resolution step's record (top_rl.driver.resolution.Resolution: the contract, Ray's address, what `auto`
    chose, TOP_RL_* overrides), which the run's plan carries too (RunPlan.resolution); None: a config resolved earlier."""
    from top_rl import contract
    from top_rl.config import kernel_backend

    top = contract.get(cfg.top.contract)
    engines = []
    for i in range(cfg.rollout.num_engines):
        if cfg.rollout.engine == "sglang":
            from top_rl.rollout.sglang.plan import launch_plan as sglang_plan

            engines.append(sglang_plan(cfg, index=i))
        else:
            engines.append({"kind": "native", "in_process": True, "kernels": kernel_backend(cfg), "logprob_source": cfg.rollout.logprob_source, "dtype": cfg.model.dtype})
    from top_rl.driver import placement

    t = cfg.trainer
    world = t.world
    plan = placement.plan(cfg.rollout.num_engines, world, cfg.cluster)
    return {
        "run_dir": cfg.run_dir,
        "steps": cfg.steps,
        "top": {"enabled": cfg.top.enabled, "contract": top.describe() if cfg.top.enabled else None,
                "on_violation": cfg.top.on_violation},
        # the attention kernel both sides run and the log-probs the gate compares, and why where `auto` chose them
        "attention": {"backend": str(cfg.top.attention_backend), "logprob_source": str(cfg.rollout.logprob_source),
                      "chosen_by": resolution.backend.why if resolution and resolution.backend else "the config"},
        # the contract and SGLang release the run will run (the contract's; `installed`: what the engines' python holds)
        "runs": {"contract": top.name if cfg.top.enabled else None, "sglang_release": top.sglang_version,
                 "sglang_installed": _installed_sglang(cfg)},
        "engines": engines,
        "trainer": {"framework": "megatron-core", "dp": t.dp, "tp": t.tp, "pp": t.pp, "cp": t.cp, "world_size": world,
                    "dtype": cfg.model.dtype, "recompute": "full, non-reentrant" if t.recompute else "off",
                    "kernels": kernel_backend(cfg)},
        "resolution": resolution.as_dict() if resolution else None,
        "ray": {"address": (resolution.ray_address if resolution else cfg.cluster.address) or "local", "placement": plan.describe(), "bundles": plan.bundles,
                "engine_bundle": plan.engine_bundle, "trainer_bundle": plan.trainer_bundle,
                "weight_transport": cfg.cluster.weight_transport},
        "model": cfg.model.path or f"random {cfg.model.family} (model.* fields)",
        "task": dataclasses.asdict(cfg.task),
    }


def _installed_sglang(cfg) -> str | None:
    """The sglang release the run's SGLang engines would import (their python's), or this interpreter's."""
    from top_rl import sglang_release

    return sglang_release.installed_version(cfg.rollout.sglang.python if cfg.rollout.engine == "sglang" else None)


def _hydra_entry():
    import hydra

    from top_rl.config import ConfigError, from_hydra

    @hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
    def _main(dict_cfg) -> None:
        _job_run_dir(dict_cfg)
        try:
            cfg = from_hydra(dict_cfg)
        except ConfigError as e:
            print(f"top-rl: {e}", file=sys.stderr)
            sys.exit(2)
        with imports_without_gc():  # the run's modules: torch among them
            from top_rl.preflight import CONFIG_CHECKS, REFUSALS, check

        if cfg.dry_run:  # the refusals the config alone decides, then the plan
            try:
                ready = check(cfg, CONFIG_CHECKS)
                plan = launch_plan(cfg, ready.resolution)
            except REFUSALS as e:
                print(f"top-rl: {e}", file=sys.stderr)
                sys.exit(getattr(e, "exit_code", 1))
            print(json.dumps(plan, indent=2, default=str))
            return
        with imports_without_gc():
            from top_rl.run.faults import RunStopped
            from top_rl.rl.gate import ParityViolation

        try:
            last = run(cfg)
        # Refusals and stops whose message is the whole story: no traceback.
        except (RunStopped, ParityViolation, *REFUSALS) as e:
            _ignore_stop_signals()  # exiting now: a late Ctrl-C must not kill the exit path
            print(f"top-rl: {e}", file=sys.stderr, flush=True)
            sys.exit(getattr(e, "exit_code", 1))
        print(json.dumps({"run_dir": cfg.run_dir, "final": last}, default=str))

    return _main


def run(cfg) -> dict:
    """One run: every check first (top_rl.preflight: each refusal before Ray, wandb or any file write, so a refused run
    leaves no run_dir behind), then the loop over what the checks loaded and the plan built from it. Returns the last
    step's metrics row."""
    with imports_without_gc():
        from top_rl import loop, preflight
    from top_rl.observe.startup import StartupLog

    startup = StartupLog()  # the start-up lines' clock starts with the checks
    ready = preflight.check(cfg)
    return loop.run(cfg, ready, preflight.run_plan(cfg, ready), startup)


def _ignore_stop_signals() -> None:
    from top_rl.run.faults import STOP_SIGNALS

    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def main() -> None:
    if sys.argv[1:2] == ["doctor"]:  # `top-rl doctor`: a check of the GPU stack, not a run (no Hydra, no Ray)
        from top_rl.tools.doctor import main as doctor

        sys.exit(doctor(sys.argv[2:]))
    from top_rl.run import faults

    quiet.install()
    faults.interrupt_on_signals()  # first: Ctrl-C during imports and checks stops the run too
    # Hydra raises what it cannot compose instead of printing it over several lines: reported below in one.
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    # wandb hands its service to child processes through WANDB_SERVICE: a top-rl started by a process that used wandb
    # would log into that parent's service, which keeps the run "in use" after this driver is killed, so the resume
    # fails ("run ID ... is in use"). The driver owns its wandb service; it exits with the driver (wandb-core --pid).
    os.environ.pop("WANDB_SERVICE", None)
    from top_rl.config import removed

    if removed.refusal(sys.argv[1:]):  # a key the run could not honour: named, with what to set instead
        print(f"top-rl: {removed.refusal(sys.argv[1:])}", file=sys.stderr, flush=True)
        sys.exit(2)
    try:
        _register_schema()
        _hydra_entry()()
    except Exception as e:  # an override Hydra cannot compose (unknown key, wrong type, bad syntax): one line
        from hydra.errors import CompactHydraException

        if not isinstance(e, CompactHydraException):
            raise
        print(f"top-rl: {hydra_error_line(e)}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:  # before the run started (inside it, RunGuard reports it as RunStopped)
        _ignore_stop_signals()
        print(f"top-rl: interrupted ({faults.startup_signal_name()}) before the run started; nothing was written",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        # Not sys.exit: when the interrupt landed inside C code that ran Python through PyRun_String (pybind11's
        # exec, during the torch/megatron imports), CPython has flagged it "unhandled" and would re-kill the
        # process with SIGINT at exit (returncode -2) although it was handled here. Nothing is open yet.
        os._exit(128 + int(signal.Signals[faults.startup_signal_name()]))
    finally:
        # What is left is the exit: its atexit calls (Ray's shutdown, wandb's) run as they would, but the interpreter's
        # last garbage collection skips the objects alive now (torch, Ray, the run's), which on 2 CPU cores took
        # 1.5 s of every run's exit and frees nothing the process does not give back by exiting.
        gc.freeze()


def export_main(argv: list[str] | None = None) -> int:
    quiet.install()
    from top_rl.tools.export import main as export

    return export(sys.argv[1:] if argv is None else argv)


def parity_probe_main(argv: list[str] | None = None) -> int:
    quiet.install()
    from top_rl.tools.parity_probe import main as probe

    return probe(sys.argv[1:] if argv is None else argv)


def convert_checkpoint_main(argv: list[str] | None = None) -> int:
    quiet.install()
    from top_rl.tools.convert_checkpoint import main as convert

    return convert(sys.argv[1:] if argv is None else argv)


def report_main(argv: list[str] | None = None) -> int:
    from top_rl.tools.report import main as report

    return report(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
