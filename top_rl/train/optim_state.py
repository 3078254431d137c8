"""An optimizer's state by parameter name (fp32 masters, AdamW's step and moments), the form a checkpoint places in any
layout (top_rl.run.dist_state); used by CpuAdamW and FusedMasterAdamW (top_rl.train.optim)."""

from __future__ import annotations

import torch


def named_state(named, master: dict, opt, value=lambda t: t) -> dict[str, dict[str, torch.Tensor]]:
    """Per parameter name: its AdamW state tensors (step, exp_avg, exp_avg_sq; none before its first step) and, for a
    compute-dtype parameter, its fp32 master (an fp32 parameter is its own master: saved with the model). The live
    tensors (`value` maps one to where it is parked), not copies: a checkpoint reads them before the next step.
    Keyed by name, so a checkpoint can place each one in any layout (top_rl.run.dist_state)."""
    out = {}
    for n, p in named:
        m = master[n]
        s = {k: value(v) for k, v in opt.state.get(m, {}).items() if torch.is_tensor(v)}
        if m is not p:
            s["master"] = value(m)
        out[n] = s
    return out


@torch.no_grad()
def load_named_state(named, master: dict, opt, sd: dict[str, dict[str, torch.Tensor]]) -> None:
    """The inverse of `named_state` (every parameter's entry): masters copied in, the AdamW state loaded by torch's
    own load_state_dict under this optimizer's param_groups (this run's hyperparameters)."""
    index = {id(p): i for i, p in enumerate(q for g in opt.param_groups for q in g["params"])}
    state = {}
    for n, p in named:
        s = dict(sd[n])
        m = master[n]
        if "master" in s:
            m.copy_(s.pop("master"))
        if s:
            state[index[id(m)]] = s
    opt.load_state_dict({"state": state, "param_groups": opt.state_dict()["param_groups"]})

