"""The STAND-IN scheduler behind the stand-in SGLang server: it receives what SGLang 0.5.11's own
TokenizerManager sends its scheduler (io_struct request objects, with SGLang's own normalized and verified
`SamplingParams`) and answers with the io_struct outputs the real scheduler + detokenizer send back
(`BatchTokenIDOutput` under `--skip-tokenizer-init`, `FlushCacheReqOutput`, the weight-update outputs).

Its numbers come from TOP-RL's model on the active kernel backend: prompt scores are `sequence_logprobs`
(fp32, no temperature); tokens are chosen by SGLang's own rl-mode sampler arithmetic (top_rl/rollout/
seeded_sampler.py: murmur-hashed Gumbel noise from (sampling_seed, seq_len - 1, token id), the native engine's
sampler too), so for the same weights, prompts and seeds it returns the tokens and log-probs a live server does.
What it copies from the real scheduler, by the pinned source (sglang/srt/managers/...):
- logprob_start_len: -1 with return_logprob means output tokens only; above len(input_ids) the request is
  aborted with 400 (scheduler.py:1873-1897); input_token_logprobs_val = [None] + values[:-1], idx =
  input_ids[start:] with ids >= vocab_size - 1 reported as 0 (scheduler_output_processor_mixin.py:601-632).
- finish: length is checked before stop tokens, so a stop token sampled as the last allowed token finishes
  with "length" (schedule_batch.py:1155-1188); stop_token_ids and the model's eos stop unless ignore_eos.
- a prefill-only request (max_new_tokens=0) in an all-prefill-only batch runs no sampler
  (tp_worker.py:500-522), so it has no output token and no output log-prob (the stand-in never mixes
  batches: each request is computed alone, which is what batch invariance makes equivalent).
- sampling: top_k=1 (temperature < 1e-6 normalizes to it) is greedy with fp32 unscaled log-probs; top_k and
  top_p restrict the draw, never the returned log-probs (layers/sampler.py:105-170): deterministic mode's pytorch
  backend sorts softmax(f32(logits) / T), zeroes what top_k / top_p cut, and draws with the same seeded sampler
  over the float64 log of the sorted probabilities (top_k_top_p_min_p_sampling_from_probs_torch); min_p > 0 with
  a seed asserts in the real sampler (:470-474): the stand-in aborts with 500 instead of dying.
- flush_cache succeeds only with no request in flight, waiting up to timeout_s (scheduler.py:2871-2888).
- update_weights_from_tensor: TP rank r deserializes serialized_named_tensors[r] (tp_worker.py:157-166); the
  stand-in plays every rank of its tp_size and loads rank 0's tensors.
- release/resume_memory_occupation (scheduler_update_weights_mixin.py:136-190): the real scheduler asserts it is
  idle, pauses the KV pool (flushing it) and the weights; after a resume the weights hold whatever the memory holds
  until the next update. The stand-in records each call with whether it was idle (`memory_events`), fills its weights
  with NaN on release (so a rollout before the next push shows as a parity failure, never as silence) and refuses a
  generation while released.
- /v1/loads (GetLoadsReqInput): one GetLoadsReqOutput with the requests in flight as running.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from http import HTTPStatus
from pathlib import Path
from typing import Callable

import torch

from top_rl import kernels
from top_rl.model import load_model, pack, sequence_logprobs
from top_rl.model.hf_io import read_safetensors
from top_rl.rollout.native import seeded_sampler

_UNSUPPORTED = ("frequency_penalty", "presence_penalty", "min_new_tokens", "logit_bias", "regex", "json_schema",
                "ebnf", "structural_tag", "custom_params", "stop_strs", "stop_regex_strs")
_NEUTRAL = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "min_new_tokens": 0}


def _construct(cls, **kw):
    """`cls(**kw)`; for 0.5.17's msgspec structs (kw_only, fields added and removed) with only the fields `cls` has,
    a required field `kw` lacks set to None (the stand-in computes none of them)."""
    import msgspec

    if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
        fields = {f.name: f.required for f in msgspec.structs.fields(cls)}
        kw = {k: v for k, v in kw.items() if k in fields}
        kw.update({k: None for k, required in fields.items() if required and k not in kw})
    return cls(**kw)


class _Done:
    """`await`-able, already finished: what an awaited send of 0.5.17's async_sock_send gets back."""

    def __await__(self):
        return iter(())


_DONE = _Done()


class StandinScheduler:
    """One thread computes requests in arrival order; control requests that need no model (flush, internal
    state, aborts) are answered on arrival, as the real scheduler answers them between batches."""

    def __init__(self, model_path: str, server_args, dtype: str | None = None):
        from sglang.srt.managers import io_struct as io

        self.io = io
        self.model = load_model(model_path, dtype).eval()
        self.server_args = server_args
        self.vocab = self.model.cfg.vocab_size
        self.eos = self.model.cfg.eos_token_id
        self.tp_size = int(server_args.tp_size)
        self.groups: dict = {}
        self.deliver: Callable[[object], None] = lambda out: None  # set by the server (into the tokenizer manager)
        self.in_flight = 0
        self.released = False
        self.memory_events: list[tuple[str, bool]] = []  # ("release" | "resume", idle when it arrived)
        self.peak_in_flight = 0
        self.hold = threading.Event()  # tests: clear() keeps generations waiting (a busy server), set() releases
        self.hold.set()
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="standin-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------ transport
    def send_pyobj(self, obj, flags=0, protocol=None):
        """What the tokenizer manager's `send_to_scheduler` socket receives (0.5.17's sock_send passes flags and the
        pickle protocol, and its async_sock_send awaits the call: the answer is an awaitable that is already done)."""
        self._send(obj)
        return _DONE

    def _send(self, obj) -> None:
        io = self.io
        if isinstance(obj, io.FlushCacheReqInput):
            return self._flush(obj)
        if isinstance(obj, io.GetInternalStateReq):
            return self.deliver(io.GetInternalStateReqOutput(internal_state={"stand_in_scheduler": True}))
        if isinstance(obj, io.AbortReq):
            return None  # every request is computed to the end; the tokenizer manager already dropped its state
        if isinstance(obj, getattr(io, "GetLoadsReqInput", ())):  # removed in 0.5.17
            return self.deliver(self._loads())
        if isinstance(obj, (io.TokenizedGenerateReqInput, io.BatchTokenizedGenerateReqInput)):
            with self._lock:
                self.in_flight += len(obj.batch) if isinstance(obj, io.BatchTokenizedGenerateReqInput) else 1
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self._queue.put(obj)

    def stop(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        io = self.io
        handlers = {io.UpdateWeightFromDiskReqInput: (self._update_from_disk, io.UpdateWeightFromDiskReqOutput),
                    io.InitWeightsUpdateGroupReqInput: (self._init_group, io.InitWeightsUpdateGroupReqOutput),
                    io.UpdateWeightsFromDistributedReqInput: (self._update_from_distributed,
                                                              io.UpdateWeightsFromDistributedReqOutput),
                    io.DestroyWeightsUpdateGroupReqInput: (self._destroy_group, io.DestroyWeightsUpdateGroupReqOutput),
                    io.UpdateWeightsFromTensorReqInput: (self._update_from_tensor, io.UpdateWeightsFromTensorReqOutput)}
        while (obj := self._queue.get()) is not None:
            if isinstance(obj, io.BatchTokenizedGenerateReqInput):
                for req in obj.batch:
                    self._generate_and_deliver(req)
            elif isinstance(obj, io.TokenizedGenerateReqInput):
                self._generate_and_deliver(obj)
            elif isinstance(obj, (io.ReleaseMemoryOccupationReqInput, io.ResumeMemoryOccupationReqInput)):
                self.deliver(self._memory(obj))
            elif type(obj) in handlers:
                handle, output = handlers[type(obj)]
                try:
                    answer = handle(obj)
                except Exception as e:  # answer (400) rather than leave the request waiting forever
                    answer = output(success=False, message=f"stand-in scheduler: {type(e).__name__}: {e}")
                self.deliver(answer)

    def _flush(self, req) -> None:
        timeout = float(req.timeout_s or 0.0)

        def answer():
            deadline = time.monotonic() + timeout
            while self.in_flight and time.monotonic() < deadline:
                time.sleep(0.01)
            self.deliver(self.io.FlushCacheReqOutput(success=self.in_flight == 0))
        if timeout <= 0 or self.in_flight == 0:
            return answer()
        threading.Thread(target=answer, daemon=True).start()

    def _loads(self):
        with self._lock:
            running = self.in_flight
        return self.io.GetLoadsReqOutput(
            dp_rank=0, timestamp=time.time(), num_running_reqs=running, num_waiting_reqs=0, num_used_tokens=0,
            num_total_tokens=0, max_total_num_tokens=1, token_usage=0.0, gen_throughput=0.0, cache_hit_rate=0.0,
            utilization=0.0, max_running_requests=1 << 20)

    def _memory(self, req):
        release = isinstance(req, self.io.ReleaseMemoryOccupationReqInput)
        with self._lock:
            self.memory_events.append(("release" if release else "resume", self.in_flight == 0))
        print(f"stand-in memory: {self.memory_events[-1][0]} idle={self.memory_events[-1][1]}", flush=True)  # the log
        if release:
            self.released = True
            sd = self.model.hf_state_dict()
            self.model.load_hf({k: torch.full_like(v, float("nan")) for k, v in sd.items()}, source="memory released")
            return self.io.ReleaseMemoryOccupationReqOutput()
        self.released = False
        return self.io.ResumeMemoryOccupationReqOutput()

    # ------------------------------------------------------------------------------ generation
    def _generate_and_deliver(self, req) -> None:
        self.hold.wait()
        try:
            if self.released:
                raise RuntimeError("the server's memory is released (release_memory_occupation): no weights to run")
            out = self._generate(req)
        except Exception as e:  # a scheduler bug answers 500 naming it, rather than hanging the request
            out = self._output(req, self._abort(f"stand-in scheduler: {type(e).__name__}: {e}",
                                                HTTPStatus.INTERNAL_SERVER_ERROR), [], None)
        with self._lock:
            self.in_flight -= 1
        self.deliver(out)

    def _abort(self, message: str, status: HTTPStatus) -> dict:
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        err = "BadRequestError" if status == HTTPStatus.BAD_REQUEST else "InternalServerError"
        return FINISH_ABORT(message, status, err).to_json()

    def _unsupported(self, sp) -> str | None:
        for key in _UNSUPPORTED:
            v = getattr(sp, key, None)
            if v and v != _NEUTRAL.get(key):
                return f"the stand-in scheduler does not implement sampling {key}={v!r}"
        if sp.repetition_penalty != 1.0:
            return f"the stand-in scheduler does not implement repetition_penalty={sp.repetition_penalty}"
        if sp.min_p > 0:
            return ("min_p > 0: SGLang's sampler asserts sampling_seed is None when min_p is needed (sampler.py:"
                    "470-474), which kills the real scheduler; the stand-in aborts the request instead")
        return None

    def _generate(self, req):
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH, FINISH_MATCHED_TOKEN

        ids, sp = list(req.input_ids), req.sampling_params
        start = req.logprob_start_len if req.return_logprob else -1
        if start == -1:
            start = len(ids)
        if start > len(ids):
            return self._output(req, self._abort(
                f"req.logprob_start_len={start} is higher than the number of input tokens "
                f"len(req.origin_input_ids)={len(ids)}. Please use a smaller logprob_start_len.",
                HTTPStatus.BAD_REQUEST), [], None)
        if (why := self._unsupported(sp)) or (why := ("top_logprobs_num / token_ids_logprob are not implemented by "
                                                      "the stand-in" if req.top_logprobs_num or req.token_ids_logprob
                                                      else None)):
            return self._output(req, self._abort(why, HTTPStatus.INTERNAL_SERVER_ERROR), [], None)
        with torch.no_grad():
            out_ids, out_lps = self._sample(ids, sp)
            in_lps = self._input_logprobs(ids, start) if req.return_logprob else None
        finish = FINISH_LENGTH(length=sp.max_new_tokens)
        if out_ids and len(out_ids) < sp.max_new_tokens:
            finish = FINISH_MATCHED_TOKEN(matched=out_ids[-1])
        return self._output(req, finish.to_json(), out_ids, (in_lps, out_lps) if req.return_logprob else None)

    def _choose(self, logits: torch.Tensor, sp, seed: int, position: int) -> tuple[int, float]:
        if sp.top_k == 1:  # an all-greedy batch: argmax, fp32 log-softmax without temperature
            tok = int(torch.argmax(logits[0].float()))
            return tok, float(kernels.prefill_logprobs(logits, torch.tensor([tok], device=logits.device))[0])
        device = logits.device
        lp = kernels.sampler_log_softmax(logits, sp.temperature)
        seeds = torch.tensor([seed], dtype=torch.int64, device=device)
        positions = torch.tensor([position], dtype=torch.int64, device=device)
        from sglang.srt.sampling.sampling_params import TOP_K_ALL

        if sp.top_k == TOP_K_ALL and sp.top_p == 1.0:  # the rl on-policy path (sampling_batch_info.py's need_*)
            tok = int(seeded_sampler.multinomial_with_seed(lp, seeds, positions)[0])
            return tok, float(lp[0, tok])
        probs = torch.softmax(logits.float() / sp.temperature, dim=-1)
        probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
        probs_sum = torch.cumsum(probs_sort, dim=-1)
        probs_sort[torch.arange(probs.shape[-1], device=device)[None, :] >= sp.top_k] = 0.0
        probs_sort[(probs_sum - probs_sort) > sp.top_p] = 0.0
        index = int(seeded_sampler.multinomial_with_seed(probs_sort.to(torch.float64).log_(), seeds, positions)[0])
        tok = int(probs_idx[0, index])
        return tok, float(lp[0, tok])

    def _sample(self, ids: list[int], sp) -> tuple[list[int], list[float]]:
        if sp.max_new_tokens == 0:
            return [], []
        model = self.model
        device = model.cos_sin.device
        stops = set() if sp.ignore_eos else set(sp.stop_token_ids or ()) | {self.eos}
        seed = 42 if sp.sampling_seed is None else int(sp.sampling_seed)
        cache = model.new_kv_cache(1, len(ids) + sp.max_new_tokens)
        slot = torch.zeros(1, dtype=torch.long, device=device)
        tok_ids, pos, cu = pack([ids], device)
        logits = model(tok_ids, pos, cu, cache, slot)[-1:]
        out, lps = [], []
        for step in range(sp.max_new_tokens):
            position = len(ids) + step
            tok, lp = self._choose(logits, sp, seed, position - 1)
            out.append(tok)
            lps.append(lp)
            if len(out) >= sp.max_new_tokens or tok in stops:
                break
            logits = model(torch.tensor([tok], device=device), torch.tensor([position], device=device),
                           cache=cache, slots=slot)
        return out, lps

    def _input_logprobs(self, ids: list[int], start: int) -> tuple[list, list]:
        """(val, idx) as the scheduler reports them: [None] + scores of ids[start+1:], ids[start:] clipped."""
        if start >= len(ids):
            return [], []
        scores = sequence_logprobs(self.model, [ids], [start + 1])[0].tolist() if start + 1 < len(ids) else []
        return [None] + scores, [t if t < self.vocab - 1 else 0 for t in ids[start:]]

    def _output(self, req, finish: dict, out_ids: list[int], logprobs):
        n_in = len(req.input_ids)
        lp = dict.fromkeys(("input_token_logprobs_val", "input_token_logprobs_idx", "output_token_logprobs_val",
                            "output_token_logprobs_idx", "input_top_logprobs_val", "input_top_logprobs_idx",
                            "output_top_logprobs_val", "output_top_logprobs_idx", "input_token_ids_logprobs_val",
                            "input_token_ids_logprobs_idx", "output_token_ids_logprobs_val",
                            "output_token_ids_logprobs_idx"))
        if logprobs is not None:
            (in_val, in_idx), out_lps = logprobs
            lp = {k: [[]] for k in lp}
            lp.update(input_token_logprobs_val=[in_val], input_token_logprobs_idx=[in_idx],
                      output_token_logprobs_val=[out_lps], output_token_logprobs_idx=[list(out_ids)])
        return _construct(self.io.BatchTokenIDOutput,
            rids=[req.rid], finished_reasons=[finish], decoded_texts=[""], decode_ids=[list(out_ids)],
            read_offsets=[0], output_ids=[list(out_ids)], skip_special_tokens=[True],
            spaces_between_special_tokens=[True], no_stop_trim=[False], prompt_tokens=[n_in], reasoning_tokens=[0],
            completion_tokens=[len(out_ids)], cached_tokens=[0], output_token_entropy_val=None,
            output_hidden_states=None, routed_experts=None, placeholder_tokens_idx=None,
            placeholder_tokens_val=None, retraction_counts=[0], spec_verify_ct=[], spec_accepted_drafts=[],
            spec_acceptance_histogram=[], **lp)

    # ------------------------------------------------------------------------------ weights
    @staticmethod
    def _named(obj, load_format) -> dict[str, torch.Tensor]:
        if load_format == "flattened_bucket":
            flat = obj["flattened_tensor"]
            return {m.name: flat[m.start_idx:m.end_idx].view(m.dtype).reshape(m.shape) for m in obj["metadata"]}
        return dict(obj)

    def _load(self, named: dict[str, torch.Tensor]) -> None:
        device = self.model.embed_tokens.device  # tensors may arrive on a GPU (CUDA IPC payloads)
        sd = self.model.hf_state_dict()
        unknown = set(named) - set(sd)
        if unknown:
            raise ValueError(f"unknown parameter names {sorted(unknown)[:3]}")
        sd.update({k: v.to(device) for k, v in named.items()})
        self.model.load_hf(sd, source="weight update")

    def _update_from_disk(self, req):
        out = self.io.UpdateWeightFromDiskReqOutput
        if not req.model_path or not Path(req.model_path).is_dir():
            return out(success=False, message=f"Failed to update weights: model_path {req.model_path!r} is not a "
                                              f"directory (stand-in scheduler). Rolling back to the previous weights.",
                       num_paused_requests=0)
        try:
            self._load(read_safetensors(req.model_path))
        except Exception as e:
            return out(success=False, message=f"Failed to update weights: {e}.", num_paused_requests=0)
        return out(success=True, message="Succeeded to update model weights.", num_paused_requests=0)

    def _init_group(self, req):
        from sglang.srt.utils.common import init_custom_process_group

        try:
            self.groups[req.group_name] = init_custom_process_group(
                backend=req.backend, init_method=f"tcp://{req.master_address}:{req.master_port}",
                world_size=req.world_size, rank=req.rank_offset, group_name=req.group_name)
        except Exception as e:
            return self.io.InitWeightsUpdateGroupReqOutput(success=False, message=f"Failed to init group: {e}.")
        return self.io.InitWeightsUpdateGroupReqOutput(success=True, message="Succeeded to initialize custom "
                                                                             "process group.")

    def _update_from_distributed(self, req):
        import torch.distributed as dist

        from top_rl.weights.buckets import unflatten

        out = self.io.UpdateWeightsFromDistributedReqOutput
        if req.group_name not in self.groups:
            return out(success=False, message=f"Group {req.group_name} not in {list(self.groups)}. Please call "
                                              f"`init_weights_update_group` first.")
        group = self.groups[req.group_name]
        meta = {"names": req.names, "dtypes": req.dtypes, "shapes": req.shapes}
        if req.load_format == "flattened_bucket":
            nbytes = sum(getattr(torch, d).itemsize * math.prod(s) for d, s in zip(req.dtypes, req.shapes))
            flat = torch.empty(nbytes, dtype=torch.uint8)
            dist.broadcast(flat, src=0, group=group)
            named = dict(unflatten(flat, meta))
        else:
            named = {n: torch.empty(s, dtype=getattr(torch, d)) for n, d, s in zip(req.names, req.dtypes, req.shapes)}
            for h in [dist.broadcast(t, src=0, group=group, async_op=True) for t in named.values()]:
                h.wait()
        self._load(named)
        return out(success=True, message="Succeeded to update parameter online.")

    def _destroy_group(self, req):
        import torch.distributed as dist

        pg = self.groups.pop(req.group_name, None)
        if pg is None:
            return self.io.DestroyWeightsUpdateGroupReqOutput(success=False, message="The group to be destroyed does "
                                                                                     "not exist.")
        dist.destroy_process_group(pg)
        return self.io.DestroyWeightsUpdateGroupReqOutput(success=True, message="Succeeded to destroy custom process "
                                                                                "group.")

    def _update_from_tensor(self, req):
        from sglang.srt.utils.common import MultiprocessingSerializer

        out = self.io.UpdateWeightsFromTensorReqOutput
        if torch.cuda.is_available():  # as SGLang's TP worker: CUDA IPC handles name devices by UUID
            from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
            monkey_patch_torch_reductions()
        entries = req.serialized_named_tensors
        if len(entries) < self.tp_size:
            return out(success=False, message=f"serialized_named_tensors has {len(entries)} entries for tp_size="
                                              f"{self.tp_size}: TP rank {len(entries)} reads entry [{len(entries)}] "
                                              f"(IndexError in the real TP worker)")
        per_rank = [MultiprocessingSerializer.deserialize(entries[rank]) for rank in range(self.tp_size)]
        ranks = [self._named(obj, req.load_format) for obj in per_rank]
        for rank, named in enumerate(ranks[1:], 1):  # every rank loads the full tensors and shards them itself
            if named.keys() != ranks[0].keys() or any(not torch.equal(named[k], ranks[0][k]) for k in named):
                return out(success=False, message=f"TP rank {rank} received other tensors than rank 0 in "
                                                  f"serialized_named_tensors[{rank}]: its shard would differ")
        self._load(ranks[0])
        return out(success=True, message="Success")
