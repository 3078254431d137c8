"""The CPU half of tests/gpu/test_sglang_reference.py, so the one GPU attempt is not spent on construction bugs:
the sgl_kernel stand-in raises naming the function, and SGLang's own Qwen3ForCausalLM is built in rl mode from a
TOP-RL checkpoint through SGLang's loader (fp32 embedding and norms kept bit for bit, fused bf16 projections),
with its pools and triton attention backend, up to the first kernel launch (a Triton launch needs a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import sglang_cpu

from tests.doubles import sgl_kernel_standin as standin

ROOT = Path(__file__).resolve().parents[2]
_ERR = sglang_cpu.import_error()


@pytest.mark.skipif(standin.real_sgl_kernel_installed(), reason="a real sgl_kernel is installed here")
def test_sgl_kernel_standin_raises_naming_the_function():
    with standin.installed():
        from sgl_kernel.kvcacheio import transfer_kv_per_layer  # what SGLang's memory pool imports
        import sgl_kernel

        assert sgl_kernel.STANDIN and repr(transfer_kv_per_layer) == "<sgl_kernel stand-in sgl_kernel.kvcacheio.transfer_kv_per_layer>"
        n = len(standin.CALLS)
        with pytest.raises(standin.SglKernelCalled, match=r"sgl_kernel\.kvcacheio\.transfer_kv_per_layer\(\) was called"):
            transfer_kv_per_layer(1, 2)
        with pytest.raises(standin.SglKernelCalled, match=r"sgl_kernel\.scalar_type\.scalar_types\.uint4b8\(\)"):
            sgl_kernel.scalar_type.scalar_types.uint4b8()  # attribute chains resolve, calls raise
        assert standin.CALLS[n:] == ["sgl_kernel.kvcacheio.transfer_kv_per_layer",
                                     "sgl_kernel.scalar_type.scalar_types.uint4b8"]
    with pytest.raises(ModuleNotFoundError):  # gone again: code probing for the real package is not fooled
        import sgl_kernel  # noqa: F401


@pytest.mark.skipif(standin.real_sgl_kernel_installed(), reason="a real sgl_kernel is installed here")
def test_standin_defines_the_torch_ops_sglang_registers_fakes_for():
    """On CUDA, sglang/srt/layers/moe/topk.py runs torch.library.register_fake("sgl_kernel::moe_fused_gate") at
    import; without the op's schema the model registry skipped qwen3 on the H200. Calling the op still raises."""
    import torch

    with standin.installed():
        for name in standin.TORCH_OPS:
            torch.library.register_fake(f"sgl_kernel::{name}")(lambda *a, **k: [a[0], a[0]])
        n = len(standin.CALLS)
        with pytest.raises(standin.SglKernelCalled, match=r"sgl_kernel\.moe_fused_gate\(\) was called"):
            torch.ops.sgl_kernel.moe_fused_gate(torch.zeros(2, 4), torch.zeros(4), 1, 1, 1)
        assert standin.CALLS[n:] == ["sgl_kernel.moe_fused_gate"]


_BUILD = r"""
import json, sys, torch
from tests import sglang_cpu
from tests.helpers import tiny_model
from top_rl.model import hf_state_dict, save_model
from tests.doubles import sgl_kernel_standin
ckpt = sys.argv[1]
save_model(tiny_model(dtype="bfloat16", tied=False, num_hidden_layers=3, vocab_size=128), ckpt)
sd = hf_state_dict(tiny_model(dtype="bfloat16", tied=False, num_hidden_layers=3, vocab_size=128))
torch.Tensor.cuda = lambda self, *a, **k: self  # rl-mode RoPE moves inv_freq with .cuda(); no GPU here
from tests.doubles.sglang_reference import SglangReference
ref = SglangReference(ckpt, device="cpu", max_reqs=4, max_tokens=64)
p = dict(ref.model.named_parameters())
m = "model.layers.1."
report = {
  "embed": [str(p["model.embed_tokens.weight"].dtype), torch.equal(p["model.embed_tokens.weight"], sd["model.embed_tokens.weight"])],
  "lm_head": [str(p["lm_head.weight"].dtype), torch.equal(p["lm_head.weight"], sd["lm_head.weight"])],
  "norm": [str(p["model.norm.weight"].dtype), torch.equal(p["model.norm.weight"], sd["model.norm.weight"])],
  "q_norm": [str(p[m + "self_attn.q_norm.weight"].dtype), torch.equal(p[m + "self_attn.q_norm.weight"], sd[m + "self_attn.q_norm.weight"])],
  "qkv": torch.equal(p[m + "self_attn.qkv_proj.weight"], torch.cat([sd[m + "self_attn." + k + "_proj.weight"] for k in "qkv"])),
  "gate_up": torch.equal(p[m + "mlp.gate_up_proj.weight"], torch.cat([sd[m + "mlp.gate_proj.weight"], sd[m + "mlp.up_proj.weight"]])),
  "layers": len(ref.model.model.layers), "backend": type(ref.attn_backend).__name__,
  "sglang": __import__("sglang").__version__,
}
try:
    with ref.mode():
        ref.extend([[5, 6, 7], [8, 9]], [0, 1])
    report["extend"] = "ran"
except Exception as e:
    report["extend"] = f"{type(e).__name__}: {e}"

# Every batch kind once more with SGLang's torch-native attention (plain SDPA, runs on CPU) instead of triton, and
# the sampler's seeded hash (a Triton kernel) replaced by an argmax: the plumbing the GPU test relies on, checked
# against our model with a tolerance (different kernels here; the GPU test demands equal bits).
import sglang.srt.layers.sampler as sampler_mod
sampler_mod.multinomial_with_seed = lambda logprobs, seed, positions: logprobs.argmax(-1)
from top_rl import kernels
from top_rl.model import KVCache, load_model, pack
ours = load_model(ckpt, "bfloat16").eval()
nat = SglangReference(ckpt, device="cpu", attention_backend="torch_native", max_reqs=4, max_tokens=64)
prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())
errs = {}
with torch.no_grad():
    ids, pos, cu = pack(prompts)
    logits = ours(ids, pos, cu).float()
    with nat.mode():
        out, handles, _ = nat.extend(prompts, [0, 2])
    rows = torch.tensor([0, 1, 5, 6])  # scored rows: start 0 (seq 0), start 2 (seq 1), minus each last row
    want = kernels.prefill_logprobs(logits[rows], ids[rows + 1])
    got = out.input_token_logprobs.float()
    report["input_lp_len"] = got.numel()
    errs["input_lp"] = rel(got[torch.tensor([0, 1, 3, 4])], want)
    errs["extend_logits"] = rel(out.next_token_logits.float(), logits[cu[1:] - 1])
    cache = KVCache(ours.cfg, 2, 16, ours.policy.kv_cache)
    slots = torch.arange(2)
    lengths = torch.tensor([3, 5])
    step_logits = ours(ids, pos, cu, cache, slots)[cu[1:] - 1]
    for step, toks in enumerate([[20, 21], [22, 23]]):
        with nat.mode():
            _, lp, picked = nat.sample(out, [1.0, 0.7], [0, 1], (lengths - 1), token_ids=toks)
        ref_lp = kernels.sampler_log_softmax(step_logits, 1.0)
        errs[f"picked_{step}"] = abs(picked[0] - float(ref_lp[0, toks[0]])) / abs(float(ref_lp[0, toks[0]]))
        step_logits = ours(torch.tensor(toks), lengths, cache=cache, slots=slots)
        lengths += 1
        with nat.mode():
            out, _ = nat.decode(handles, toks)
        errs[f"decode_logits_{step}"] = rel(out.next_token_logits.float(), step_logits.float())
report["errs"] = errs
report["calls"] = sgl_kernel_standin.CALLS
print("REPORT " + json.dumps(report))
"""


@pytest.mark.skipif(_ERR is not None, reason=_ERR or "")
def test_sglang_qwen3_builds_in_rl_mode_from_our_checkpoint(tmp_path):
    # its own process: SGLang's global ServerArgs and process groups must not leak into other tests
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", _BUILD, str(tmp_path / "ckpt")], cwd=ROOT,
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)})
    lines = [x for x in out.stdout.splitlines() if x.startswith("REPORT ")]
    print(lines[-1] if lines else "")
    assert lines, f"the build did not finish:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    rep = json.loads(lines[-1][len("REPORT "):])
    # the child imports the release this pass tests (CI's 0.5.17 pass puts it on PYTHONPATH; a child that dropped
    # PYTHONPATH built 0.5.11's model under the 0.5.17 pass and hid 0.5.17's runner fields)
    assert rep["sglang"] == sglang_cpu.SGLANG_VERSION, rep["sglang"]
    for key in ("embed", "norm", "q_norm"):  # rl mode keeps these fp32, with the checkpoint's exact values
        assert rep[key] == ["torch.float32", True], (key, rep[key])
    assert rep["lm_head"] == ["torch.bfloat16", True] and rep["qkv"] and rep["gate_up"]
    assert rep["layers"] == 3 and rep["backend"] == "TritonAttnBackend"
    assert rep["extend"].startswith("RuntimeError: 0 active drivers"), rep["extend"]  # first Triton launch: needs a GPU
    assert rep["input_lp_len"] == 3 + 3  # (3 - 0) + (5 - 2) rows, each sequence's last one padded
    bad = {k: v for k, v in rep["errs"].items() if not v < 2e-2}
    assert not bad, f"SGLang (torch-native attention, CPU) vs our model beyond bf16 noise: {bad} (all: {rep['errs']})"
    assert rep["calls"] == []  # no sgl_kernel function on the way
