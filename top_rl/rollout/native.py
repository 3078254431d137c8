"""The native engine: in-process batched generation over the kernel seam (the embedded default).

It runs the same kernels as the trainer, so the only way a sample can change is through its own prompt,
seed and the weights. Sampling is Gumbel-max on the sampler's log-probs (§6.3) with noise drawn from a
generator seeded by (sample seed, position): a sample draws the same noise whatever batch it is in.
"""

from __future__ import annotations

import torch

from top_rl import kernels
from top_rl.model.packing import pack, sequence_logprobs
from top_rl.rollout.base import LogprobSource, mix_seed, RolloutEngine, RolloutSample, SamplingParams


def gumbel_noise(seed: int, position: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(mix_seed(seed, position) % (2**63))
    u = torch.rand(vocab, generator=g, dtype=torch.float64).clamp_(min=1e-300)
    return -torch.log(-torch.log(u))


class NativeEngine(RolloutEngine):
    def __init__(self, model, logprob_source: LogprobSource = "prefill", eos_token_id: int | None = None):
        if logprob_source not in ("prefill", "decode"):
            raise ValueError(f"logprob_source={logprob_source!r}; choose 'prefill' or 'decode'")
        self.model = model.eval()
        self.logprob_source = logprob_source
        self.eos_token_id = model.cfg.eos_token_id if eos_token_id is None else eos_token_id

    @torch.no_grad()
    def generate(self, prompts, seeds, params: SamplingParams) -> list[RolloutSample]:
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        if not prompts:
            return []
        model, n = self.model, len(prompts)
        stops = set(params.stop_token_ids) | ({self.eos_token_id} if self.eos_token_id is not None else set())
        max_len = max(map(len, prompts)) + params.max_new_tokens
        if max_len > model.cfg.max_position_embeddings:
            raise ValueError(
                f"prompt + max_new_tokens = {max_len} tokens exceeds max_position_embeddings="
                f"{model.cfg.max_position_embeddings}"
            )
        device = model.cos_sin.device
        cache = model.new_kv_cache(n, max_len)
        ids, pos, cu = pack(prompts, device)
        slots = torch.arange(n, device=device)
        logits = model(ids, pos, cu, cache, slots)[cu[1:] - 1]
        lengths = torch.tensor([len(p) for p in prompts], device=device)
        responses, sample_lps = [[] for _ in range(n)], [[] for _ in range(n)]
        finish = ["length"] * n
        active = list(range(n))
        while active:
            lp = kernels.sampler_log_softmax(logits, params.temperature)
            for row, i in enumerate(active):
                noise = gumbel_noise(seeds[i], int(lengths[i]) - 1, lp.shape[-1]).to(lp.device)
                tok = int(torch.argmax(lp[row].double() + noise))
                responses[i].append(tok)
                sample_lps[i].append(float(lp[row, tok]))
                if tok in stops:
                    finish[i] = "stop"
            active = [i for i in active if finish[i] != "stop" and len(responses[i]) < params.max_new_tokens]
            if not active:
                break
            act = torch.tensor(active, device=device)
            last = torch.tensor([responses[i][-1] for i in active], device=device)
            logits = model(last, lengths[act], cache=cache, slots=act)
            lengths[act] += 1
        if self.logprob_source == "prefill":
            gate_lps = self.score(prompts, responses)
        else:
            gate_lps = sample_lps
        return [
            RolloutSample(list(p), r, list(g), s, f, seed)
            for p, r, g, s, f, seed in zip(prompts, responses, gate_lps, sample_lps, finish, seeds)
        ]

    @torch.no_grad()
    def score(self, prompts, responses) -> list[list[float]]:
        seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
        lps = sequence_logprobs(self.model, seqs, [len(p) for p in prompts])
        return [x.tolist() for x in lps]

    @torch.no_grad()
    def update_weights(self, hf_state_dict: dict) -> None:
        self.model.load_hf(hf_state_dict, source="weight update")
