"""The native engine: in-process batched generation over the kernel seam (the embedded default).

It runs the same kernels as the trainer, so the only way a sample can change is through its own prompt, seed and
the weights. Tokens are chosen exactly as SGLang's rl-mode sampler chooses them (seeded_sampler.py: Gumbel-max
over the sampler's log-probs, noise hashed from (sampling seed, position, token id)), so a live server given the
same weights, prompts, seeds and temperature returns the same tokens and log-probs.

A decode step stays on the device: every row decodes every step (a finished row runs on and its extra tokens are
dropped at the end; no row's numbers depend on another's), tokens and their log-probs go into [rows, steps]
tensors, and the host reads the device only every CHECK_EVERY steps (have all rows met a stop token?) and once at
the end. On CUDA the step can be a CUDA graph (decode_graph.py).
"""

from __future__ import annotations

import torch

from top_rl import kernels
from top_rl.model.packing import PREFILL_TOKENS_PER_CALL, pack, sequence_logprobs, token_budget_chunks
from top_rl.rollout.native import decode_graph, seeded_sampler
from top_rl.engine.interface import LogprobSource, RolloutEngine, RolloutSample, SamplingParams

CHECK_EVERY = 8  # decode steps between the host's "all rows stopped?" reads


def sample(logits, temperature, seeds, positions) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's rl-mode choice for each row (seeded_sampler.py) and its sampler log-prob (§6.2, compute dtype)."""
    lp = kernels.sampler_log_softmax(logits, temperature)
    tok = seeded_sampler.multinomial_with_seed(lp, seeds, positions)
    return tok, lp.gather(1, tok[:, None])[:, 0]


class DecodeState:
    """One generate call's decode state on the device. `step()` decodes each row's last token `tok` at `pos`, samples
    the next one at position `pos` (the sequence length before it, minus 1: SGLang's convention) and advances; it
    only writes into these tensors and the KV cache, so a CUDA graph of it replays the same step."""

    def __init__(self, model, cache, lm_head, seeds, temperature, tok, lp, pos):
        self.model, self.cache, self.lm_head = model, cache, lm_head
        self.seeds, self.temperature = seeds, temperature
        self.tok, self.lp, self.pos = tok, lp, pos

    def step(self) -> None:
        logits = self.model(self.tok, self.pos, cache=self.cache, lm_head=self.lm_head)
        tok, lp = sample(logits, self.temperature, self.seeds, self.pos)
        self.tok.copy_(tok)
        self.lp.copy_(lp)
        self.pos.add_(1)


class NativeEngine(RolloutEngine):
    def __init__(self, model, logprob_source: LogprobSource = "prefill", eos_token_id: int | None = None,
                 cuda_graphs: bool | None = None):
        """`cuda_graphs`: None lets decode_graph.wanted() decide (CUDA, the audited kernels, the plan's decode_graphs)."""
        if logprob_source not in ("prefill", "decode"):
            raise ValueError(f"logprob_source={logprob_source!r}; choose 'prefill' or 'decode'")
        self.model = model.eval()
        self.logprob_source = logprob_source
        self.eos_token_id = model.cfg.eos_token_id if eos_token_id is None else eos_token_id
        self.cuda_graphs = cuda_graphs

    def _check(self, prompts, seeds, params) -> None:
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        seeded_sampler.check_seeds(seeds)
        max_len = max(map(len, prompts)) + params.max_new_tokens
        if max_len > self.model.cfg.max_position_embeddings:
            raise ValueError(f"prompt + max_new_tokens = {max_len} tokens exceeds max_position_embeddings="
                             f"{self.model.cfg.max_position_embeddings}")

    def _prefill(self, prompts, cache, lm_head) -> torch.Tensor:
        """Each prompt into its cache slot, in packed calls of at most PREFILL_TOKENS_PER_CALL tokens; the logits of
        each prompt's last token [n, V]."""
        device, out = self.model.cos_sin.device, []
        for chunk in token_budget_chunks([len(p) for p in prompts], PREFILL_TOKENS_PER_CALL):
            ids, pos, cu = pack([prompts[i] for i in chunk], device)
            slots = torch.arange(chunk.start, chunk.stop, device=device)
            out.append(self.model(ids, pos, cu, cache, slots, logit_rows=cu[1:] - 1, lm_head=lm_head))
        return torch.cat(out) if len(out) > 1 else out[0]

    @torch.no_grad()
    def generate(self, prompts, seeds, params: SamplingParams) -> list[RolloutSample]:
        if not prompts:
            if seeds:
                raise ValueError(f"0 prompts but {len(seeds)} seeds")
            return []
        self._check(prompts, seeds, params)
        model, n, steps = self.model, len(prompts), params.max_new_tokens
        device = model.cos_sin.device
        stops = sorted(set(params.stop_token_ids) | ({self.eos_token_id} if self.eos_token_id is not None else set()))
        stop_ids = torch.tensor(stops, dtype=torch.long, device=device)
        cache = model.new_kv_cache(n, max(map(len, prompts)) + steps)
        lm_head = model.lm_head_weight()  # once per call (a tied head is a compute-dtype copy of the embedding)
        lengths = torch.tensor([len(p) for p in prompts], device=device)
        seeds_t = torch.tensor(seeds, dtype=torch.int64, device=device)
        temperature = torch.full((n,), float(params.temperature), dtype=torch.float32, device=device)
        tok, lp = sample(self._prefill(prompts, cache, lm_head), temperature, seeds_t, lengths - 1)
        state = DecodeState(model, cache, lm_head, seeds_t, temperature, tok, lp, lengths)
        tokens = torch.empty((n, steps), dtype=torch.long, device=device)
        token_lps = torch.empty((n, steps), dtype=lp.dtype, device=device)
        tokens[:, 0], token_lps[:, 0] = tok, lp
        runner = decode_graph.StepRunner(state, decode_graph.wanted(device, self.cuda_graphs))
        done = 1
        while done < steps:
            if done % CHECK_EVERY == 0 and bool(torch.isin(tokens[:, :done], stop_ids).any(1).all()):
                break
            runner.step()
            tokens[:, done], token_lps[:, done] = state.tok, state.lp
            done += 1
        runner.close()
        return self._samples(prompts, seeds, tokens[:, :done].cpu(), token_lps[:, :done].cpu(), stops, steps)

    def _samples(self, prompts, seeds, tokens, token_lps, stops, max_new) -> list[RolloutSample]:
        """Cut each row after its first stop token (host tensors), and score if the gate reads prefill log-probs."""
        is_stop = torch.isin(tokens, torch.tensor(stops, dtype=torch.long))
        stopped = is_stop.any(1)
        lengths = torch.where(stopped, is_stop.int().argmax(1) + 1, torch.full_like(stopped, max_new, dtype=torch.long))
        responses = [t[:k].tolist() for t, k in zip(tokens, lengths.tolist())]
        sample_lps = [t[:k].tolist() for t, k in zip(token_lps, lengths.tolist())]
        gate_lps = self.score(prompts, responses) if self.logprob_source == "prefill" else sample_lps
        return [RolloutSample(list(p), r, list(g), s, "stop" if stop else "length", seed)
                for p, r, g, s, stop, seed in zip(prompts, responses, gate_lps, sample_lps, stopped.tolist(), seeds)]

    @torch.no_grad()
    def score(self, prompts, responses) -> list[list[float]]:
        seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
        lps = sequence_logprobs(self.model, seqs, [len(p) for p in prompts])
        flat = torch.cat(lps).tolist() if lps else []  # one device-to-host copy
        out, at = [], 0
        for r in responses:
            out.append(flat[at:at + len(r)])
            at += len(r)
        return out

    # ------------------------------------------------------------------ weights (engine/interface.py's EngineWeights)
    @torch.no_grad()
    def load_named_tensors(self, named: dict, version: int | None = None) -> None:
        """The native engine's one way in: every transport that reaches it (object store, broadcast, CUDA IPC) ends
        in whole HF-named tensors. `version` is the actor's to record (EngineActor stamps samples with it)."""
        self.model.load_hf(named, source="weight update")
