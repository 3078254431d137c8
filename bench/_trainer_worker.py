"""One worker process of bench/trainer_step.py (one model x one trainer, recompute on and/or off), or the stock
attention selection (--select-attention). A process per worker keeps each trainer's GPU memory, global patches
(recompute, kernel backend) and any CUDA fault to itself.

stdout carries one JSON record per line, `RESULT {...}`, `PROFILE {...}`, `ATTN {...}` or `NOTE {...}`;
everything else (warnings, tracebacks) goes to stderr, which the driver keeps in a log file.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import traceback

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])

import torch  # noqa: E402
from torch.autograd.profiler import record_function  # noqa: E402

from bench import _profile_families as pf  # noqa: E402
from bench._trainer_common import (MODELS, PEAK_TFLOPS, Timer, init_params, make_batch, make_loss_fn,  # noqa: E402
                                   make_shaped_batch, median, model_flops, sequence_lengths)


def emit(kind: str, obj: dict) -> None:
    print(kind, json.dumps(obj), flush=True)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- runners
class TopRunner:
    """The TOP trainer (top_rl.train.Trainer) through its public API: train_step, and logprobs (the gate)."""

    def __init__(self, cfg, mbt: int, recompute: bool, device):
        from top_rl.train import Trainer, TrainerSettings

        self.trainer = Trainer(cfg, TrainerSettings(tp=1, micro_batch_size=None, micro_batch_tokens=mbt, lr=1e-6,
                                                    recompute=recompute, dtype="bfloat16"))
        init_params(self.trainer.model.named_parameters())
        self.trainer.optimizer.reset()  # fp32 master weights from the values just written

    def step(self, batch, loss_fn):
        self.trainer.train_step(batch, loss_fn)

    def gate(self, batch):
        self.trainer.logprobs(batch)

    old_logprobs = gate  # the same no-grad forward of the whole batch

    @contextlib.contextmanager
    def markers(self):
        opt = self.trainer.optimizer
        step = opt.step

        def marked():
            with record_function("bench::optimizer"):
                return step()

        opt.step = marked
        try:
            with pf.seam_markers():
                yield
        finally:
            del opt.step  # back to the class's method


class StockRunner:
    """Megatron-core's own GPTModel (bench/_stock_gpt.py) with the TOP trainer's optimizer class (Megatron DDP
    + fused AdamW on GPU, top_rl.train.optim.GpuAdamW) and its micro-batching and THD packing (top_rl.train.batch: no numerics)."""

    def __init__(self, cfg, mbt: int, recompute: bool, device):
        from bench import _stock_gpt as sg
        from top_rl.train import parallel
        from top_rl.train import recompute as rc
        from top_rl.config.trainer import TrainerConfig
        from top_rl.train.optim import CpuAdamW, GpuAdamW

        rc.install()  # full recompute through torch's non-reentrant checkpoint, as the TOP trainer
        parallel.init_process_group()
        layout = parallel.init_model_parallel(1, 1, 1)
        tc = sg.transformer_config(cfg, recompute=recompute, cpu=device.type == "cpu")
        self.model = sg.build_model(cfg, tc, device)
        init_params(self.model.named_parameters())
        tcfg = TrainerConfig(lr=1e-6, micro_batch_size=None, micro_batch_tokens=mbt)
        self.opt = GpuAdamW(self.model, tcfg, layout, tc) if device.type == "cuda" else CpuAdamW(self.model, tcfg, layout)
        self.forward = self.opt.forward_module or self.model
        self.processor = sg.make_output_processor()
        self.mbt, self.device = mbt, device

    def step(self, batch, loss_fn):
        from top_rl.train.batch import pack_micro_batch, plan

        self.model.train()
        self.opt.zero_grad()
        for idx in plan(batch, dp_rank=0, dp_size=1, micro_batch_size=None, micro_batch_tokens=self.mbt):
            mb = pack_micro_batch(batch, idx, device=self.device)
            flat = self.forward(input_ids=mb.input_ids, position_ids=None, attention_mask=None,
                                packed_seq_params=mb.params, output_processor=self.processor,
                                output_processor_context=mb)
            loss_fn(list(flat.split(mb.scored_sizes)), mb.indices).backward()
            self.opt.accumulate()
        with record_function("bench::optimizer"):
            self.opt.step()

    @torch.no_grad()
    def old_logprobs(self, batch):
        """The old-log-prob forward verl and slime run before the update: the batch's log-probs, no graph kept."""
        from top_rl.train.batch import pack_micro_batch, plan

        self.model.eval()
        for idx in plan(batch, dp_rank=0, dp_size=1, micro_batch_size=None, micro_batch_tokens=self.mbt):
            mb = pack_micro_batch(batch, idx, device=self.device)
            self.forward(input_ids=mb.input_ids, position_ids=None, attention_mask=None, packed_seq_params=mb.params,
                         output_processor=self.processor, output_processor_context=mb)

    @contextlib.contextmanager
    def markers(self):
        from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
        from megatron.core.transformer.mlp import MLP

        from bench._stock_gpt import FusedRMSNorm, StockCoreAttention

        rules = [(ColumnParallelLinear, "linear"), (RowParallelLinear, "linear"), (torch.nn.RMSNorm, "norm"),
                 (FusedRMSNorm, "norm"),
                 (StockCoreAttention, "attention"), (MLP, "swiglu")]
        with pf.module_markers(self.model, rules):
            yield


class TopBaselineRunner(TopRunner):
    """The TOP trainer with this branch's speedups switched off: eager elementwise forwards (RMSNorm, SiLU-and-mul)
    and backwards, and the memory-efficient attention backward (≈ the trainer before issue 12; set in run_worker
    before any import)."""

    ENV = {"TOP_RL_FUSED_FORWARD": "0", "TOP_RL_FUSED_BACKWARD": "0", "TOP_RL_ATTENTION_BACKWARD": "efficient"}


class TopFlashRecomputeRunner(TopRunner):
    """The TOP trainer with top.fast_paths.recompute_attention: with recompute on, the recompute inside the backward
    runs FlashAttention-2's forward and hands its LSE to the flash backward (the gated forward stays the engine's)."""

    ENV = {"TOP_RL_RECOMPUTE_ATTENTION": "1"}


class TopCublasRecomputeRunner(TopRunner):
    """The TOP trainer with top.fast_paths.recompute_gemm: with recompute on, the recompute inside the backward runs
    the linear layers' GEMMs on cuBLAS (the gated forward stays the engine's mm_BI)."""

    ENV = {"TOP_RL_RECOMPUTE_GEMM": "1"}


RUNNERS = {"top": TopRunner, "top_base": TopBaselineRunner, "top_flash_rc": TopFlashRecomputeRunner,
           "top_cublas_rc": TopCublasRecomputeRunner, "stock": StockRunner}
TOP_IMPLS = ("top", "top_base", "top_flash_rc", "top_cublas_rc")


# ---------------------------------------------------------------------------------------------- one config
def run_config(args, cfg, batch, loss_fn, recompute: bool, mbt: int, device, profile: bool) -> dict:
    runner = RUNNERS[args.impl](cfg, mbt, recompute, device)
    timer = Timer(device)
    for _ in range(args.warmup):
        runner.step(batch, loss_fn)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = [timer(lambda: runner.step(batch, loss_fn)) for _ in range(args.iters)]
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    step_ms = median(times)
    gate_ms = old_logprob_ms = None
    if args.impl == "top" and recompute:  # the gate is a no-grad forward: measured once per model
        runner.gate(batch)
        gate_ms = median([timer(lambda: runner.gate(batch)) for _ in range(args.iters)])
    if args.old_logprob_forward:  # bench/rl_step_compare.py: the separate old-log-prob pass, after a warm-up one
        runner.old_logprobs(batch)
        old_logprob_ms = median([timer(lambda: runner.old_logprobs(batch)) for _ in range(args.iters)])
    tokens = sum(len(s.tokens) for s in batch)
    flops, hw_flops = model_flops(cfg, batch), model_flops(cfg, batch, recompute=recompute)
    n_micro = len(list(_plan(batch, mbt)))
    rec = {"model": args.model, "impl": args.impl, "recompute": recompute, "mbt": mbt, "micro_batches": n_micro,
           "tokens": tokens, "step_ms": step_ms, "step_ms_all": times, "tokens_per_s": tokens / step_ms * 1e3,
           "tflops": flops / step_ms / 1e9, "mfu": flops / step_ms / 1e9 / PEAK_TFLOPS,
           "hfu": hw_flops / step_ms / 1e9 / PEAK_TFLOPS, "peak_gib": peak,
           "gate_ms": gate_ms, "old_logprob_ms": old_logprob_ms, "status": "ok"}
    emit("RESULT", rec)
    if profile:
        with runner.markers():
            summary = pf.profile_step(lambda: runner.step(batch, loss_fn), device, step_ms)
        emit("PROFILE", {"model": args.model, "impl": args.impl, "recompute": recompute, "mbt": mbt, **summary})
    del runner
    return rec


def _plan(batch, mbt):
    from top_rl.train.batch import plan

    return plan(batch, dp_rank=0, dp_size=1, micro_batch_size=None, micro_batch_tokens=mbt)


def _free():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_worker(args) -> None:
    device = torch.device(args.device)
    if device.type == "cuda":  # the GPU's NUMA-local cores (bench/_numa.py): said in the notes either way
        from bench import _numa

        emit("NOTE", {"model": args.model, "impl": args.impl, "recompute": None, "text": _numa.pin_to_gpu()})
    cfg = MODELS[args.model]
    if args.batch_shape:  # an RL job's step (bench/rl_step_compare.py): sequences,prompt,response
        batch, adv = make_shaped_batch(cfg, *(int(x) for x in args.batch_shape.split(",")))
    else:
        batch, adv = make_batch(cfg, args.tokens)
    loss_fn = make_loss_fn(batch, adv)
    if args.impl in TOP_IMPLS:
        os.environ.update(getattr(RUNNERS[args.impl], "ENV", {}))
        from top_rl import kernels
        from top_rl.kernels import plan

        attn = os.environ.get(plan.ATTENTION_ENV, "triton") if device.type == "cuda" else "reference"
        # the runner's ENV (top_base: fast paths off) reaches the kernels through the plan builder, as in a run
        kernels.install(plan.build("sglang" if device.type == "cuda" else "reference",
                                   attention=attn if device.type == "cuda" else None))
        note = f"kernels {kernels.backend_name()}, attention {attn}" + {
            "top_base": " (fused forwards/backwards off, memory-efficient attention backward)",
            "top_flash_rc": " (the recompute's attention forward: FlashAttention-2)",
            "top_cublas_rc": " (the recompute's GEMMs: cuBLAS)"}.get(args.impl, "")
    else:
        from bench import _stock_attention, _stock_gpt

        _stock_attention.use(args.attention)
        note = "; ".join([f"attention {args.attention}"] + _stock_gpt.prepare(device))
    for rc_name in args.recompute.split(","):
        recompute = rc_name == "on"
        emit("NOTE", {"model": args.model, "impl": args.impl, "recompute": recompute, "text": note})
        mbt = args.mbt_on if recompute else args.mbt_off
        while True:
            oom = False
            try:
                run_config(args, cfg, batch, loss_fn, recompute, mbt, device, profile=args.profile == rc_name)
            except torch.OutOfMemoryError as e:
                oom = True
                log(f"OOM: {args.model} {args.impl} recompute={rc_name} mbt={mbt}: {e}")
            except Exception as e:  # noqa: BLE001 - reported as the row's status; the next config still runs
                traceback.print_exc()
                emit("RESULT", {"model": args.model, "impl": args.impl, "recompute": recompute, "mbt": mbt,
                                "status": f"error: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"})
            _free()
            if not oom:
                break
            emit("RESULT", {"model": args.model, "impl": args.impl, "recompute": recompute, "mbt": mbt,
                            "status": "OOM"})
            if mbt // 2 < 2048:
                break
            mbt //= 2
    if args.impl in TOP_IMPLS and device.type == "cuda":
        from top_rl import kernels

        fell_back = [f"{op} fell back ({why[:200]})" for op, why in kernels.report()["fallbacks"].items()]
        if fell_back:
            emit("NOTE", {"model": args.model, "impl": args.impl, "recompute": args.recompute == "on",
                          "text": "; ".join(fell_back)})


def run_select_attention(args) -> None:
    from bench import _stock_attention

    device = torch.device(args.device)
    lengths = sequence_lengths(args.tokens)
    # cuDNN's ragged path is the least proven here: it runs last for every model, so a CUDA fault it might
    # cause cannot take the other candidates' rows with it.
    for candidates in (("flash", "efficient"), ("cudnn",)):
        for name in args.model.split(","):
            cfg = MODELS[name]
            _stock_attention.select(lengths, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, device,
                                    candidates=candidates,
                                    on_row=lambda row, name=name: emit("ATTN", {"model": name, "impl": row[0],
                                                                                "ms": row[1], "status": row[2]}))


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--select-attention", action="store_true")
    p.add_argument("--impl", choices=sorted(RUNNERS), default="top")
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--recompute", default="on,off")
    p.add_argument("--mbt-on", type=int, default=16384)
    p.add_argument("--mbt-off", type=int, default=16384)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--profile", default="none", help="profile the step of this recompute setting: on | off | none")
    p.add_argument("--attention", default="flash", help="stock attention implementation")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch-shape", default="", help="SEQUENCES,PROMPT,RESPONSE: an RL job's batch instead of --tokens "
                   "of mixed lengths (bench/rl_step_compare.py)")
    p.add_argument("--old-logprob-forward", action="store_true",
                   help="also time the no-grad forward of the batch (old_logprob_ms): the old-log-prob pass")
    args = p.parse_args(argv)
    if args.select_attention:
        run_select_attention(args)
    else:
        run_worker(args)


if __name__ == "__main__":
    main()
