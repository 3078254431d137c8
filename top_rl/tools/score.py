"""`python -m top_rl.tools.score --model DIR --input-ids 1,2,3`: a checkpoint's log-probs under TOP kernels.

Prints {"logprobs": [...]} where entry i is log p(id[i+1] | id[0..i]) (the engine's prefill path: fp32,
no temperature), computed by the same kernels the trainer uses.
"""

from __future__ import annotations

import argparse
import json
import sys

from top_rl import contract, kernels
from top_rl.dtypes import DTYPE_NAMES
from top_rl.model import UnsupportedModel, load_model, sequence_logprobs


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise SystemExit(f"--input-ids must be comma-separated integers, got {text!r}") from None
    if len(ids) < 2:
        raise SystemExit("--input-ids needs at least 2 tokens (the first is only context)")
    return ids


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m top_rl.tools.score", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="Hugging Face checkpoint directory (dense Qwen3 today)")
    ap.add_argument("--input-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--dtype", default=None, choices=DTYPE_NAMES,
                    help="compute dtype (default: the checkpoint's torch_dtype)")
    ap.add_argument("--backend", default="reference", choices=kernels.available_backends())
    ap.add_argument("--contract", default=contract.fallback().name, choices=sorted(contract.CONTRACTS),
                    help="the TOP contract the kernels compute under (a run's top.contract)")
    args = ap.parse_args(argv)
    ids = parse_ids(args.input_ids)
    from top_rl.kernels import plan

    kernels.install(plan.build(args.backend, args.contract))
    try:
        model = load_model(args.model, args.dtype)
    except UnsupportedModel as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    bad = [i for i in ids if not 0 <= i < model.cfg.vocab_size]
    if bad:
        print(f"error: token ids {bad[:5]} outside the vocabulary [0, {model.cfg.vocab_size})", file=sys.stderr)
        return 2
    lp = sequence_logprobs(model, [ids], [1])[0]
    print(json.dumps({"logprobs": lp.tolist()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
