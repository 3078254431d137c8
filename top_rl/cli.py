"""Entry points: `top-rl [hydra overrides]`, `top-rl-export run_dir=... out=DIR`, `top-rl-parity-probe`."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

CONF_DIR = str(Path(__file__).resolve().parent / "conf")  # package data: ships in the wheel


def _register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    from top_rl.config import RunConfig

    ConfigStore.instance().store(name="run_schema", node=RunConfig)


def compose(overrides: list[str]):
    """The validated RunConfig for these overrides (tests and tools; `main` goes through @hydra.main)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from top_rl.config import from_hydra

    _register_schema()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return from_hydra(hydra_compose(config_name="config", overrides=overrides))


def launch_plan(cfg) -> dict:
    """What `dry_run=true` prints: engines (with full commands for SGLang), trainer layout, contract, Ray."""
    from top_rl import contract

    top = contract.get(cfg.top.contract)
    engines = []
    for i in range(cfg.rollout.num_engines):
        if cfg.rollout.engine == "sglang":
            from top_rl.rollout.sglang import launch_plan as sglang_plan

            engines.append(sglang_plan(cfg, index=i))
        else:
            engines.append({"kind": "native", "in_process": True, "kernels": cfg.top.kernels if cfg.top.enabled
                            else "plain", "logprob_source": cfg.rollout.logprob_source, "dtype": cfg.model.dtype})
    t = cfg.trainer
    return {
        "run_dir": cfg.run_dir,
        "steps": cfg.steps,
        "top": {"enabled": cfg.top.enabled, "contract": top.describe() if cfg.top.enabled else None,
                "on_violation": cfg.top.on_violation},
        "engines": engines,
        "trainer": {"framework": "megatron-core", "tp": t.tp, "pp": t.pp, "cp": t.cp, "world_size": t.tp * t.pp * t.cp,
                    "dtype": t.dtype, "recompute": "full, non-reentrant" if t.recompute else "off",
                    "kernels": cfg.top.kernels if cfg.top.enabled else "plain"},
        "ray": {"address": cfg.cluster.address or "local", "engine_bundle": {"CPU": cfg.cluster.engine_cpus,
                "GPU": cfg.cluster.engine_gpus}, "trainer_bundle": {"CPU": cfg.cluster.trainer_cpus,
                "GPU": cfg.cluster.trainer_gpus}},
        "model": cfg.model.path or "tiny random Qwen3 (model.* fields)",
        "task": cfg.task,
    }


def _hydra_entry():
    import hydra

    from top_rl.config import ConfigError, from_hydra

    @hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
    def _main(dict_cfg) -> None:
        try:
            cfg = from_hydra(dict_cfg)
        except ConfigError as e:
            print(f"top-rl: {e}", file=sys.stderr)
            sys.exit(2)
        if cfg.dry_run:
            print(json.dumps(launch_plan(cfg), indent=2, default=str))
            return
        from top_rl import loop
        from top_rl.faults import RunStopped
        from top_rl.preflight import REFUSALS
        from top_rl.rl.gate import ParityViolation

        try:
            last = loop.run(cfg)
        # Refusals and stops whose message is the whole story: no traceback.
        except (RunStopped, ParityViolation, *REFUSALS) as e:
            print(f"top-rl: {e}", file=sys.stderr, flush=True)
            sys.exit(getattr(e, "exit_code", 1))
        print(json.dumps({"run_dir": cfg.run_dir, "final": last}, default=str))

    return _main


def main() -> None:
    from top_rl import faults

    faults.interrupt_on_signals()  # first: Ctrl-C during imports and checks stops the run too
    try:
        _register_schema()
        _hydra_entry()()
    except KeyboardInterrupt:  # before the run started (inside it, RunGuard reports it as RunStopped)
        print(f"top-rl: interrupted ({faults.startup_signal_name()}) before the run started; nothing was written",
              file=sys.stderr, flush=True)
        sys.exit(128 + int(signal.Signals[faults.startup_signal_name()]))


def export_main(argv: list[str] | None = None) -> int:
    from top_rl.export import main as export

    return export(sys.argv[1:] if argv is None else argv)


def parity_probe_main(argv: list[str] | None = None) -> int:
    from top_rl.parity_probe import main as probe

    return probe(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
