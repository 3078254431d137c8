"""(a) TOP step time: forward + backward of a Qwen3-0.6B-shaped model (full vocab 151936, bf16, random
weights) on one 4096-token sequence, loss = -mean prefill log-prob; `sglang` backend vs `plain` (stock
torch kernels). Run on the GPU: python bench/step_time.py"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from bench._util import table, time_ms  # noqa: E402
from tests.gpu._common import device_model  # noqa: E402
from top_rl import kernels  # noqa: E402
from top_rl.kernels import sglang_attention  # noqa: E402
from top_rl.model import pack  # noqa: E402

SEQ = 4096


def main():
    sglang_attention.set_attention_backend(os.environ.get(sglang_attention.ENV_VAR, "triton"))
    model = device_model(seed=0, vocab_size=151936)
    g = torch.Generator().manual_seed(0)
    ids, pos, cu = pack([torch.randint(3, 151936, (SEQ,), generator=g).tolist()], "cuda")
    rows = []
    for name in ("sglang", "plain"):
        with kernels.use_backend(name):
            def fwd():
                with torch.no_grad():
                    kernels.prefill_logprobs(model(ids, pos, cu)[:-1], ids[1:])

            def fwd_bwd():
                loss = -kernels.prefill_logprobs(model(ids, pos, cu)[:-1], ids[1:]).mean()
                loss.backward()
                model.zero_grad(set_to_none=True)

            t_f = time_ms(fwd)
            torch.cuda.reset_peak_memory_stats()
            t_fb = time_ms(fwd_bwd)
            rows.append([name, t_f, t_fb, SEQ / t_fb * 1e3, torch.cuda.max_memory_allocated() / 2**30])
    ratio = rows[0][2] / rows[1][2]
    print(table(f"TOP step, Qwen3-0.6B shape, one {SEQ}-token sequence",
                ["backend", "fwd ms", "fwd+bwd ms", "tokens/s", "peak GiB"], rows))
    print(f"sglang / plain fwd+bwd time ratio: {ratio:.2f}x")


if __name__ == "__main__":
    main()
