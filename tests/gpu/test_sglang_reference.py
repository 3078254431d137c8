"""SGLang 0.5.11's own Qwen3ForCausalLM in rl mode is the reference (tests/doubles/sglang_reference.py):
our native model/engine and the Megatron trainer, on the `sglang` kernel backend with triton attention, must give
its bits (torch.equal) for every layer's output, the logits, the prompt log-probs of its input_token_logprobs path
(in several packings on both sides), its sampler's tokens and log-probs and its decode steps. The `plain` backend (the
non-TOP baseline) must differ. sglang-kernel is absent: any call into the stand-in fails naming the function.
The checkpoint is written to a temp dir: fp32 embedding and norms with values bf16 cannot represent, tied and
untied, 4 layers, Qwen3's head_dim 128 and a 32000-token vocabulary (not a multiple of lsm_BI's 1024 block).
CPU half: tests/rollout/test_sglang_reference_build.py.
"""

from __future__ import annotations

import random

import pytest
import torch

from top_rl import kernels
from top_rl.model import KVCache, Qwen3, Qwen3Config, load_model, pack, save_model
from top_rl.engine.interface import SamplingParams
from top_rl.rollout.native.engine import NativeEngine
from tests.gpu._common import decode_equals_extend_claimed, needs_cuda
from tests.helpers import use_backend

pytestmark = [needs_cuda, pytest.mark.gpu]

if torch.cuda.is_available():  # before anything imports SGLang's layers: the contract's env, the sgl_kernel stand-in
    from tests.doubles.sglang_reference import prepare_process

    prepare_process()

CFG = dict(vocab_size=32000, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
           num_key_value_heads=2, head_dim=128, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
           max_position_embeddings=4096, torch_dtype="bfloat16", eos_token_id=None)
PROMPT_LENS = [3, 17, 64, 129, 300]
NEW_TOKENS = 6
TEMPERATURES = (1.0, 0.7)


def _diff(what: str, got: torch.Tensor, want: torch.Tensor, rows: list[str] | None = None) -> str:
    """Where two tensors first differ, for the failure message."""
    if got.shape != want.shape:
        return f"{what}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
    bad = (got != want) & ~(got.isnan() & want.isnan())
    idx = bad.nonzero()[0].tolist()
    row = rows[idx[0]] if rows else f"row {idx[0]}"
    return (f"{what}: {int(bad.sum())}/{bad.numel()} values differ; first at {row} index {idx}: ours "
            f"{float(got[tuple(idx)])!r} vs SGLang {float(want[tuple(idx)])!r}")


def _token_names(seqs) -> list[str]:
    return [f"sequence {i} token {j}" for i, s in enumerate(seqs) for j in range(len(s))]


@pytest.fixture(autouse=True)
def no_sgl_kernel_call():
    from tests.doubles import sgl_kernel_standin

    start = len(sgl_kernel_standin.CALLS)
    yield
    calls = sgl_kernel_standin.CALLS[start:]
    assert not calls, f"SGLang called sgl_kernel functions {calls} (first: {calls[0]}); sglang-kernel is absent here"


@pytest.fixture(autouse=True)
def triton_attention_on_both_sides():
    """SGLang's reference runs TritonAttnBackend (the only one it builds without sglang-kernel), so our side must
    too, whatever TOP_RL_ATTENTION_BACKEND chose: conftest's per-test fixture (which runs before this one) had set
    our side to it, so under TOP_RL_ATTENTION_BACKEND=flashinfer these tests compared our flashinfer attention with
    SGLang's triton attention (and failed at layer 0)."""
    from top_rl.kernels.sglang import attention as sglang_attention

    before = sglang_attention.attention_backend()
    sglang_attention.set_attention_backend("triton")
    yield
    sglang_attention.set_attention_backend(before)


@pytest.fixture(scope="module", params=["tied", "untied"])
def setup(request, tmp_path_factory):
    from top_rl.kernels.sglang import attention as sglang_attention
    from tests.doubles.sglang_reference import SglangReference

    tied = request.param == "tied"
    path = tmp_path_factory.mktemp(f"ref_{request.param}")
    src = Qwen3(Qwen3Config(**CFG, tie_word_embeddings=tied), "bfloat16").init_random(3 if tied else 4, std=0.05)
    assert not torch.equal(src.embed_tokens, src.embed_tokens.bfloat16().float())  # fp32 bits matter
    assert not torch.equal(src.norm, src.norm.bfloat16().float())
    save_model(src, path)
    model = load_model(path, "bfloat16").to("cuda").eval()
    train = pytest.importorskip("top_rl.train", reason="Megatron-core trainer not importable here")
    # triton on our side while the trainers load, whatever TOP_RL_ATTENTION_BACKEND chose (as the per-test fixture
    # above does for each test); set back after, so the session's plan reaches later modules' fixtures unchanged
    before = sglang_attention.attention_backend()
    sglang_attention.set_attention_backend("triton")
    try:
        with use_backend("sglang"):
            # built before SGLang's groups: SGLang reuses Megatron's default process group
            trainers = {mbs: train.Trainer(model.cfg, train.TrainerSettings(tp=1, dtype="bfloat16", micro_batch_size=mbs))
                        for mbs in (1, 3)}
            for t in trainers.values():
                t.load_hf(str(path))
    finally:
        sglang_attention.set_attention_backend(before)
    ref = SglangReference(str(path), device="cuda", max_reqs=32, max_tokens=16384)
    rng = random.Random(11)
    prompts = [[rng.randrange(3, CFG["vocab_size"]) for _ in range(n)] for n in PROMPT_LENS]
    return dict(model=model, ref=ref, trainers=trainers, train=train, prompts=prompts, tied=tied)


def _sglang_extend(ref, seqs, starts):
    with ref.mode():
        out, handles, _ = ref.extend(seqs, starts)
    ref.release(handles)
    return out


def test_layers_logits_and_prompt_logprobs_equal_sglang(setup):
    model, ref, prompts = setup["model"], setup["ref"], setup["prompts"]
    ours_layers, theirs_layers = [], []
    hooks = [m.register_forward_hook(lambda m, i, o: ours_layers.append(o)) for m in model.layers]
    hooks += [m.register_forward_hook(lambda m, i, o: theirs_layers.append(o)) for m in ref.model.model.layers]
    try:
        with torch.no_grad():
            ids, pos, cu = pack(prompts, "cuda")
            logits = model(ids, pos, cu).float()
        out = _sglang_extend(ref, prompts, [0] * len(prompts))
    finally:
        for h in hooks:
            h.remove()
    names = _token_names(prompts)
    for layer, (ours, theirs) in enumerate(zip(ours_layers, theirs_layers)):
        for part, a, b in (("output", ours[0], theirs[0]), ("residual", ours[1], theirs[1])):
            assert a.dtype == b.dtype and torch.equal(a, b), _diff(f"layer {layer} {part}", a, b, names)
    assert len(ours_layers) == len(theirs_layers) == CFG["num_hidden_layers"]
    last = (cu[1:] - 1).long()
    got, want = logits[last], out.next_token_logits[:, :CFG["vocab_size"]].float()
    assert torch.equal(got, want), _diff("last-token logits", got, want, [f"sequence {i}" for i in range(len(prompts))])
    # SGLang's input_token_logprobs at logprob_start_len=0: row p scores token p+1 (each sequence's last row padded)
    rows = _scored_rows(cu)
    with torch.no_grad():
        ours_lp = kernels.prefill_logprobs(model(ids, pos, cu)[rows], ids[rows + 1]).float()
    theirs_lp = out.input_token_logprobs.float().to(rows.device)[rows]
    assert torch.equal(ours_lp, theirs_lp), _diff("prompt log-probs", ours_lp, theirs_lp,
                                                  [names[int(r) + 1] for r in rows])


def _scored_rows(cu: torch.Tensor) -> torch.Tensor:
    """Packed rows that score a next token of the same sequence (all but each sequence's last)."""
    return torch.cat([torch.arange(int(s), int(e) - 1) for s, e in zip(cu[:-1], cu[1:])]).to(cu.device)


def _responses(setup, temperature):
    engine = NativeEngine(setup["model"], logprob_source="decode", eos_token_id=-1)
    return engine.generate(setup["prompts"], seeds=list(range(len(setup["prompts"]))),
                           params=SamplingParams(max_new_tokens=NEW_TOKENS, temperature=temperature))


def test_trainer_prefill_logprobs_equal_sglang_input_token_logprobs_in_several_packings(setup):
    ref, train, trainers = setup["ref"], setup["train"], setup["trainers"]
    samples = _responses(setup, 1.0)
    seqs = [s.prompt_ids + s.response_ids for s in samples]
    plens = [len(s.prompt_ids) for s in samples]

    def sglang_scores(order):
        out = _sglang_extend(ref, [seqs[i] for i in order], [plens[i] - 1 for i in order])
        parts = out.input_token_logprobs.float().cpu().split([len(seqs[i]) - plens[i] + 1 for i in order])
        scores = {i: p[:-1] for i, p in zip(order, parts)}  # each part's last row is the padded id 0
        return [scores.get(i) for i in range(len(seqs))]  # None for samples not in this batch

    n = len(seqs)
    sglang = {"one batch": sglang_scores(list(range(n))), "reversed": sglang_scores(list(range(n))[::-1])}
    for i in range(n):
        sglang[f"alone {i}"] = [None] * n
        sglang[f"alone {i}"][i] = sglang_scores([i])[i]
    want = sglang["one batch"]
    for name, got in sglang.items():  # SGLang's own prefill is packing-invariant
        for i, g in enumerate(got):
            assert g is None or torch.equal(g, want[i]), _diff(f"SGLang {name}: sample {i}", g, want[i])
    batch = [train.TrainSequence(tuple(s), p) for s, p in zip(seqs, plens)]
    for mbs, trainer in trainers.items():
        for order_name, order in (("same", list(range(n))), ("reversed", list(range(n))[::-1])):
            got = trainer.logprobs([batch[i] for i in order])
            for k, i in enumerate(order):
                assert got[k].dtype == torch.float32 and torch.equal(got[k], want[i]), _diff(
                    f"trainer micro_batch_size={mbs} order {order_name}: sample {i} (prompt {plens[i]} tokens)",
                    got[k], want[i])
    # the engine's own prefill re-scoring too
    scored = NativeEngine(setup["model"], "prefill").score([s.prompt_ids for s in samples],
                                                           [s.response_ids for s in samples])
    for i, s in enumerate(scored):
        assert torch.equal(torch.tensor(s, dtype=torch.float32), want[i]), _diff(f"engine score {i}",
                                                                                 torch.tensor(s), want[i])


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_sampler_and_decode_steps_equal_sglang(setup, temperature):
    """Teacher-forced on our engine's samples: at every step SGLang's decode logits equal our decode logits (the
    native engine's calls), SGLang's own Sampler (rl mode, the same seeds, positions = seq_len - 1) picks the
    engine's token, and its sampler log-prob of that token equals our engine's sample log-prob."""
    model, ref, prompts = setup["model"], setup["ref"], setup["prompts"]
    samples = _responses(setup, temperature)
    n, temps, seeds = len(prompts), [temperature] * len(prompts), list(range(len(prompts)))
    device = "cuda"
    cache = KVCache(model.cfg, n, max(map(len, prompts)) + NEW_TOKENS, model.policy.kv_cache, device)
    slots = torch.arange(n, device=device)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    with torch.no_grad():
        ids, pos, cu = pack(prompts, device)
        ours = model(ids, pos, cu, cache, slots)[cu[1:] - 1]
    with ref.mode():
        out, handles, fb = ref.extend(prompts, None)
    decode_vs_prefill = []
    for step in range(NEW_TOKENS):
        tokens = [s.response_ids[step] for s in samples]
        where = f"temperature {temperature} step {step}"
        theirs = out.next_token_logits[:, :CFG["vocab_size"]].float()
        assert torch.equal(ours.float(), theirs), _diff(f"{where} logits ({'prefill' if step == 0 else 'decode'})",
                                                         ours.float(), theirs, [f"sequence {i}" for i in range(n)])
        positions = (lengths - 1).to(torch.int64)
        with ref.mode():
            sampled, sampled_lp, picked = ref.sample(out, temps, seeds, positions, token_ids=tokens)
        assert sampled == tokens, f"{where}: SGLang's sampler picked {sampled}, the native engine {tokens}"
        our_lp = kernels.sampler_log_softmax(ours, temperature)
        got = our_lp[torch.arange(n, device=device), torch.tensor(sampled, device=device)].float()
        assert torch.equal(got, sampled_lp.float()), _diff(f"{where} sampler log-prob of SGLang's sampled ids",
                                                           got, sampled_lp.float())
        engine_lp = torch.tensor([s.sample_logprobs[step] for s in samples])
        assert torch.equal(engine_lp, torch.tensor(picked)), _diff(f"{where} SGLang sampler log-prob of the engine's "
                                                                   f"token vs the engine's", engine_lp,
                                                                   torch.tensor(picked))
        decode_vs_prefill.append(picked)
        if step + 1 == NEW_TOKENS:
            break
        with torch.no_grad():
            ours = model(torch.tensor(tokens, device=device), lengths, cache=cache, slots=slots)
        lengths += 1
        with ref.mode():
            out, _ = ref.decode(handles, tokens)
    ref.release(handles)
    # Decode-step vs prefill bits: asserted where a contract claims triton's decode equals its extend; otherwise
    # the contract must refuse logprob_source=decode with triton (decode_equals_extend_claimed checks that).
    trainer = next(iter(setup["trainers"].values()))
    recompute = trainer.logprobs([setup["train"].TrainSequence(tuple(s.prompt_ids + s.response_ids),
                                                               len(s.prompt_ids), temperature) for s in samples])
    equal = sum(int((r.float() == torch.tensor([d[i] for d in decode_vs_prefill])).sum())
                for i, r in enumerate(recompute))
    print(f"T={temperature}: SGLang decode-step sampler log-probs equal to the trainer's sampler-path prefill "
          f"recompute on {equal}/{n * NEW_TOKENS} tokens")
    if decode_equals_extend_claimed("triton"):
        assert equal == n * NEW_TOKENS, f"T={temperature}: decode != prefill on {n * NEW_TOKENS - equal} tokens"


def test_plain_backend_differs_from_sglang(setup):
    """Negative control: the non-TOP baseline's kernels do not give SGLang's bits, so the checks above can fail."""
    model, ref, prompts = setup["model"], setup["ref"], setup["prompts"]
    out = _sglang_extend(ref, prompts, [0] * len(prompts))
    ids, pos, cu = pack(prompts, "cuda")
    rows = _scored_rows(cu)
    theirs = out.input_token_logprobs.float().to(rows.device)[rows]
    with torch.no_grad(), use_backend("plain"):
        plain = kernels.prefill_logprobs(model(ids, pos, cu)[rows], ids[rows + 1]).float()
    with torch.no_grad():
        top = kernels.prefill_logprobs(model(ids, pos, cu)[rows], ids[rows + 1]).float()
    assert torch.equal(top, theirs)
    assert not torch.equal(plain, theirs), "the plain backend gave SGLang's bits: the comparison cannot fail"
    print(f"plain backend: {int((plain != theirs).sum())}/{plain.numel()} prompt log-probs differ from SGLang's")
