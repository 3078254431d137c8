"""`top-rl-parity-probe`: compare a live SGLang server's log-probs with the trainer's, token by token, bitwise.

Given the server's URL and the HF checkpoint it serves, the probe
1. reads /server_info and lists every deviation from the TOP contract (release, determinism flags, backend);
2. gets sequences: prompts (a file, or random ids) completed by the server with one seed per sample, or
   prompt+response pairs from a file (e.g. a parity-gate dump), which are only re-scored;
3. asks the server for its log-probs: `prefill` (re-scoring, fp32, no temperature, docs/numerics.md §6.1) and/or
   `decode` (the sampler's output_token_logprobs, compute dtype, tempered, §6.2);
4. recomputes both with the trainer's model and kernels (`backend=reference` on CPU, `sglang` on a GPU with the
   server's attention backend) and reports, per source and sample, the mean and max |trainer - engine|, the share
   of bitwise-equal tokens, and the first differing (sample, position, token, both values). A NaN or inf on
   either side counts as a difference, never as zero.
Prints a JSON report (also to `out=`). Exit code: 0 all equal and the server runs the contract, 1 a log-prob
differs, 2 usage or connection error, 3 all equal but the server's flags deviate from the contract.
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import torch

from top_rl import contract, kernels
from top_rl.dtypes import DTYPE_NAMES
from top_rl.tools.args import Arg, KeyValueCli, UsageError
from top_rl.rollout.sglang.client import SglangClient, SglangError
from top_rl.rollout.sglang.protocol import generate_payload, items, parse_generation, parse_scores, score_payload


def server_violations(info: dict, top: contract.TopContract) -> list[str]:
    want = {"version": top.sglang_version, "enable_deterministic_inference": True, "rl_on_policy_target": "fsdp",
            "skip_tokenizer_init": True, "tp_size": 1}
    bad = [f"{k}={info.get(k)!r} (TOP needs {v!r})" for k, v in want.items() if info.get(k) != v]
    backend = info.get("attention_backend")
    if backend not in top.attention_backends:
        bad.append(f"attention_backend={backend!r} (TOP needs one of {list(top.attention_backends)})")
    if backend in top.radix_cache_required_off and info.get("disable_radix_cache") is not True:
        bad.append(f"disable_radix_cache={info.get('disable_radix_cache')!r} (TOP needs True with {backend})")
    return bad


def read_sequences(path: str) -> list[tuple[list[int], list[int] | None]]:
    """JSONL lines: [ids...] or {"input_ids": [...]} (a prompt to complete) or {"prompt_ids", "response_ids"}."""
    out = []
    for ln, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{ln}: invalid JSON ({e.msg})") from None
        if isinstance(row, list):
            row = {"input_ids": row}
        prompt = row.get("prompt_ids", row.get("input_ids")) if isinstance(row, dict) else None
        resp = row.get("response_ids") if isinstance(row, dict) else None
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
            raise ValueError(f"{path}:{ln}: need a non-empty list of token ids (input_ids or prompt_ids)")
        out.append((prompt, resp))
    if not out:
        raise ValueError(f"{path}: no sequences")
    return out


def _num(x: float):
    return x if math.isfinite(x) else str(x)  # JSON has no NaN/inf


def compare(prompts: list[list[int]], responses: list[list[int]], engine: list[list[float]],
            trainer: list[list[float]]) -> dict:
    """Per-sample and overall |trainer - engine|; the overall abs_diff is the mean of per-sample means (miles)."""
    per, first, tokens, equal = [], None, 0, 0
    for i, (e_lp, t_lp) in enumerate(zip(engine, trainer)):
        diffs = []
        for j, (a, b) in enumerate(zip(e_lp, t_lp)):
            same = a == b and math.isfinite(a)
            d = 0.0 if same else (abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf)
            diffs.append(d)
            equal += same
            if not same and first is None:
                first = {"sample": i, "position": j, "absolute_position": len(prompts[i]) + j,
                         "token_id": responses[i][j], "engine": _num(a), "trainer": _num(b)}
        tokens += len(diffs)
        mean = sum(diffs) / len(diffs) if diffs else 0.0
        per.append({"sample": i, "tokens": len(diffs), "abs_diff_mean": _num(mean),
                    "abs_diff_max": _num(max(diffs, default=0.0)), "equal_tokens": sum(d == 0.0 for d in diffs)})
    means = [p["abs_diff_mean"] for p in per if p["tokens"]]
    overall = sum(m if isinstance(m, float) else math.inf for m in means) / len(means) if means else 0.0
    return {"abs_diff": _num(overall), "abs_diff_max": max((p["abs_diff_max"] for p in per), default=0.0,
                                                            key=lambda v: v if isinstance(v, float) else math.inf),
            "tokens": tokens, "equal_fraction": equal / tokens if tokens else 1.0, "bitwise_equal": first is None,
            "first_diff": first, "per_sample": per}


def _trainer_logprobs(model, prompts, responses, temperature, batch: int) -> list[list[float]]:
    from top_rl.model import sequence_logprobs

    out: list[list[float]] = []
    with torch.no_grad():
        for s in range(0, len(prompts), batch):
            ps, rs = prompts[s:s + batch], responses[s:s + batch]
            keep = [k for k, r in enumerate(rs) if r]
            lps = sequence_logprobs(model, [ps[k] + rs[k] for k in keep], [len(ps[k]) for k in keep], temperature)
            got = dict(zip(keep, lps))
            out += [got[k].float().tolist() if k in got else [] for k in range(len(ps))]
    return out


def _cli() -> KeyValueCli:
    return KeyValueCli("top-rl-parity-probe", __doc__.split("\n\n")[0].removeprefix(
        "`top-rl-parity-probe`: ").strip(), [
        Arg("url", "the SGLang server, e.g. http://127.0.0.1:30000", required=True),
        Arg("model", "the HF checkpoint directory the server serves", required=True),
        Arg("prompts", "JSONL of prompts or prompt/response pairs (default: random prompts)"),
        Arg("num_prompts", "random prompts", int, 8),
        Arg("prompt_len", "tokens per random prompt", int, 16),
        Arg("seed", "random prompts and the per-sample sampling seeds", int, 0),
        Arg("max_new_tokens", "tokens the server generates per prompt", int, 32),
        Arg("temperature", "sampling temperature (> 1e-6)", float, 1.0),
        Arg("contract", "the TOP contract the server and the trainer's kernels must run (a run's top.contract)", str,
            contract.fallback().name, choices=tuple(contract.CONTRACTS)),
        Arg("source", "which engine log-probs to compare", str, "both", choices=("prefill", "decode", "both")),
        Arg("backend", "trainer kernels: reference (CPU) or sglang (GPU)", str, "reference",
            choices=tuple(kernels.available_backends())),
        Arg("attention_backend", "the sglang backend's attention (default: the server's)"),
        Arg("dtype", "compute dtype (default: the checkpoint's torch_dtype)", choices=DTYPE_NAMES),
        Arg("device", "default: cuda for backend=sglang, else cpu"),
        Arg("batch_size", "sequences per trainer forward", int, 8),
        Arg("timeout", "seconds per server request", float, 600.0),
        Arg("out", "also write the JSON report here"),
        Arg("server_check", "false: do not fail (exit 3) on contract deviations of the server", bool, True),
    ], epilog="Exit code: 0 all equal and the server runs the contract, 1 a log-prob differs, 2 usage or "
              "connection error,\n3 all equal but the server's flags deviate from the contract.")


def main(argv: list[str] | None = None) -> int:
    cli = _cli()
    try:
        args = cli.parse(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"top-rl-parity-probe: {e}\n{cli.usage()}", file=sys.stderr)
        return 2
    if args is None:  # --help
        return 0
    if not args.url.startswith(("http://", "https://")):
        print(f"top-rl-parity-probe: url={args.url!r} needs its scheme, e.g. http://127.0.0.1:30000\n{cli.usage()}",
              file=sys.stderr)
        return 2
    device = args.device or ("cuda" if args.backend == "sglang" else "cpu")
    try:
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("no CUDA GPU is visible here")
    except RuntimeError as e:
        print(f"top-rl-parity-probe: device={device!r}: {e}\n{cli.usage()}", file=sys.stderr)
        return 2
    if contract.temperature_refusal(args.temperature):
        print(f"error: temperature={args.temperature} {contract.temperature_refusal(args.temperature)}", file=sys.stderr)
        return 2
    client = SglangClient(args.url, args.timeout, max_retries=2)
    try:
        info = client.server_info()
    except SglangError as e:
        print(f"error: cannot read {args.url}/server_info: {e}", file=sys.stderr)
        return 2
    top = contract.get(args.contract)
    violations = server_violations(info, top)

    from top_rl.model import UnsupportedModel, load_model

    from top_rl.kernels import plan

    attention = (args.attention_backend or info.get("attention_backend")) if args.backend == "sglang" else None
    kernels.install(plan.build(args.backend, top.name, attention=attention))  # the server's kernel: compared like for like
    try:
        model = load_model(args.model, args.dtype).eval()
    except (UnsupportedModel, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model.to(device)
    vocab = model.cfg.vocab_size

    try:
        seqs = read_sequences(args.prompts) if args.prompts else None
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if seqs is None:
        rng = random.Random(args.seed)
        seqs = [([rng.randrange(vocab) for _ in range(args.prompt_len)], None) for _ in range(args.num_prompts)]
    prompts = [p for p, _ in seqs]
    responses: list[list[int]] = [list(r) if r is not None else [] for _, r in seqs]
    decode_engine: dict[int, list[float]] = {}
    try:
        todo = [i for i, (_, r) in enumerate(seqs) if r is None]
        if todo:
            sp = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
            resp = client.generate(generate_payload([prompts[i] for i in todo], [args.seed + i for i in todo], sp))
            for i, item in zip(todo, items(resp, len(todo))):
                g = parse_generation(item, i)
                responses[i], decode_engine[i] = g.output_ids, g.logprobs
        report_sources = {}
        if args.source in ("prefill", "both"):
            keep = [i for i, r in enumerate(responses) if r]
            resp = client.generate(score_payload([prompts[i] for i in keep], [responses[i] for i in keep]))
            scored = {i: parse_scores(item, i, prompts[i], responses[i], vocab) for i, item in zip(keep, items(resp, len(keep)))}
            engine = [scored.get(i, []) for i in range(len(prompts))]
            trainer = _trainer_logprobs(model, prompts, responses, None, args.batch_size)
            report_sources["prefill"] = compare(prompts, responses, engine, trainer)
        if args.source in ("decode", "both") and decode_engine:
            idx = sorted(decode_engine)
            trainer = _trainer_logprobs(model, [prompts[i] for i in idx], [responses[i] for i in idx],
                                        args.temperature, args.batch_size)
            rep = compare([prompts[i] for i in idx], [responses[i] for i in idx], [decode_engine[i] for i in idx], trainer)
            if rep["first_diff"]:
                rep["first_diff"]["sample"] = idx[rep["first_diff"]["sample"]]
            for p in rep["per_sample"]:
                p["sample"] = idx[p["sample"]]
            report_sources["decode"] = rep
    except SglangError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    equal = all(r["bitwise_equal"] for r in report_sources.values())
    report = {"url": args.url, "model": args.model, "contract": top.name,
              "server": {k: info.get(k) for k in ("version", "attention_backend", "tp_size", "enable_deterministic_inference",
                                                  "rl_on_policy_target", "disable_radix_cache", "weight_version")},
              "server_contract_violations": violations, "kernel_backend": args.backend,
              "dtype": str(model.policy.compute).removeprefix("torch."), "temperature": args.temperature,
              "samples": len(prompts), "sources": report_sources, "bitwise_equal": equal}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    for name, r in report_sources.items():
        fd = r["first_diff"]
        where = "all equal" if fd is None else (f"first difference: sample {fd['sample']} position {fd['position']} "
                                                f"token {fd['token_id']}: engine {fd['engine']} trainer {fd['trainer']}")
        print(f"{name}: {r['tokens']} tokens, abs_diff {r['abs_diff']}, max {r['abs_diff_max']}, "
              f"equal {r['equal_fraction']:.4f}; {where}", file=sys.stderr)
    for v in violations:
        print(f"server deviates from the TOP contract: {v}", file=sys.stderr)
    if not equal:
        return 1
    return 3 if violations and args.server_check else 0


if __name__ == "__main__":
    sys.exit(main())
