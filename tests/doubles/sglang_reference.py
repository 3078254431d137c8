"""SGLang's own Qwen3ForCausalLM (0.5.11 or 0.5.17, the one installed) in rl mode, driven without a server: the reference the trainer and
the native engine must equal bit for bit (tests/gpu/test_sglang_reference.py).

What it builds, each from SGLang's own code:
- global ServerArgs with the contract's flags (`--rl-on-policy-target fsdp --enable-deterministic-inference
  --disable-radix-cache`, bf16, the given attention backend) and the batch-invariant aten overrides, enabled
  only inside `SglangReference.mode()` (SGLang's model runner enables them process-wide; here TOP-RL's side
  runs outside them, so its numbers come from its own kernel seam only);
- its parallel state for world size 1 (reusing an existing default process group, e.g. Megatron's);
- the model through SGLang's DefaultModelLoader from an HF checkpoint directory;
- a minimal model runner as SGLang's attention-backend unit tests build one (sglang/test/attention/
  test_flashattn_backend.py: MockModelRunner), with the real ReqToTokenPool, MHATokenToKVPool and the
  attention backend (TritonAttnBackend for "triton");
- ForwardBatch for EXTEND (with input_token_logprobs from `logprob_start_len`) and DECODE, and SGLang's Sampler.
sglang-kernel is absent: `sgl_kernel_standin` stands in and records any call (none is expected).
The builder runs on CPU up to the first kernel launch (tests/rollout/test_sglang_reference_build.py checks that far).
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from top_rl import contract
from tests.doubles import sgl_kernel_standin


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_process(top: contract.TopContract | None = None) -> None:
    """The contract's engine env (default: the contract this process computes under, $TOP_RL_CONTRACT, so SGLang's
    model runs the trainer's GEMM path) and the sgl_kernel stand-in, before anything imports sglang's layers."""
    from top_rl.kernels.sglang.backend import active_contract, pin_engine_env

    pin_engine_env(top or active_contract())
    sgl_kernel_standin.install()


def server_args(model_path: str, device: str, attention_backend: str):
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path=model_path, device=device, attention_backend=attention_backend,
                      enable_deterministic_inference=True, rl_on_policy_target="fsdp", disable_radix_cache=True,
                      dtype="bfloat16", kv_cache_dtype="auto", skip_tokenizer_init=True, disable_cuda_graph=True,
                      tp_size=1)


def init_parallel_state(device: str) -> None:
    """SGLang's groups for world size 1, on the default process group if one exists (Megatron's), else a new one."""
    from sglang.srt.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized():
        return
    backend = "nccl" if device == "cuda" else "gloo"
    if torch.distributed.is_initialized():
        backend = torch.distributed.get_backend()
    ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend=backend,
                                    distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
    ps.initialize_model_parallel(tensor_model_parallel_size=1)


@dataclass
class Seq:
    """One request's KV slots: its req_to_token row and the token slots it holds."""
    row: int
    slots: list[int]


class SglangReference:
    def __init__(self, model_path: str, device: str = "cuda", attention_backend: str = "triton",
                 max_reqs: int = 16, max_tokens: int = 8192):
        prepare_process()
        from sglang.srt.configs.device_config import DeviceConfig
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.configs.model_config import AttentionArch, ModelConfig
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.model_loader.loader import DefaultModelLoader
        from sglang.srt.server_args import set_global_server_args_for_scheduler

        self.device = device
        # torch_native is not allowed with deterministic inference: the server args then name triton
        self.server_args = sa = server_args(model_path, device,
                                            "triton" if attention_backend == "torch_native" else attention_backend)
        set_global_server_args_for_scheduler(sa)
        init_parallel_state(device)
        self.model_config = mc = ModelConfig.from_server_args(sa)
        from sglang.srt.layers.dp_attention import initialize_dp_attention

        initialize_dp_attention(server_args=sa, model_config=mc)  # as the model runner does (DP size 1)
        self.model = DefaultModelLoader(LoadConfig(load_format="auto")).load_model(
            model_config=mc, device_config=DeviceConfig(device))
        hf = mc.hf_config
        self.vocab_size = hf.vocab_size
        self.req_to_token_pool = ReqToTokenPool(size=max_reqs, max_context_len=mc.context_len, device=device,
                                                enable_memory_saver=False)
        self.kv_pool = MHATokenToKVPool(size=max_tokens, page_size=1, dtype=torch.bfloat16,
                                        head_num=hf.num_key_value_heads, head_dim=mc.head_dim,
                                        layer_num=hf.num_hidden_layers, device=device, enable_memory_saver=False)
        # The model runner the attention backend reads (fields as SGLang's MockModelRunner in its backend tests).
        self.runner = SimpleNamespace(
            device=device, gpu_id=0, dtype=torch.bfloat16, kv_cache_dtype=torch.bfloat16, page_size=1,
            server_args=sa, model_config=mc, req_to_token_pool=self.req_to_token_pool, token_to_kv_pool=self.kv_pool,
            token_to_kv_pool_allocator=None, sliding_window_size=None, is_hybrid_swa=False, attention_chunk_size=None,
            hybrid_gdn_config=None, kimi_linear_config=None, linear_attn_model_spec=None, attn_cp_size=1,
            is_draft_worker=False)  # 0.5.17's TritonAttnBackend reads it (speculative tree masks); 0.5.11's does not
        assert mc.attention_arch == AttentionArch.MHA
        self.attn_backend = self._backend(attention_backend)
        self._next_slot = 1  # slot 0 is SGLang's padding slot
        self._free_rows = list(range(max_reqs))

    def _backend(self, name: str):
        if name == "torch_native":  # plain torch SDPA: lets the CPU test drive every batch kind (not a contract backend)
            from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

            return TorchNativeAttnBackend(self.runner)
        if name != "triton":
            raise ValueError(f"attention backend {name!r}: only triton runs where sglang-kernel is absent")
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        return TritonAttnBackend(self.runner)

    # ------------------------------------------------------------------------------------ modes
    @contextlib.contextmanager
    def mode(self):
        """SGLang's batch-invariant aten overrides (what its model runner enables in deterministic mode), and no grad."""
        from sglang.srt.batch_invariant_ops import batch_invariant_ops as bio

        # The overrides register for the CUDA dispatch key only (0.5.11 raises on a host without CUDA or XPU).
        on_gpu = self.runner.device != "cpu"
        if on_gpu:
            bio.enable_batch_invariant_mode()
        try:
            with torch.inference_mode():
                yield
        finally:
            if on_gpu:
                bio.disable_batch_invariant_mode()

    # ------------------------------------------------------------------------------------ batches
    def _alloc(self, n: int) -> list[int]:
        if self._next_slot + n > self.kv_pool.size:
            raise RuntimeError(f"KV pool of {self.kv_pool.size} tokens is full")
        out = list(range(self._next_slot, self._next_slot + n))
        self._next_slot += n
        return out

    def release(self, seqs: list[Seq]) -> None:
        self._free_rows.extend(s.row for s in seqs)

    def _pools(self) -> dict:
        """The pools and attention backend a ForwardBatch carries in 0.5.11. 0.5.17's ForwardBatch has no such fields:
        its layers read the backend (and the pools it holds) from the forward context `_forward` publishes."""
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        fields = {"req_to_token_pool": self.req_to_token_pool, "token_to_kv_pool": self.kv_pool,
                  "attn_backend": self.attn_backend}
        return {k: v for k, v in fields.items() if k in ForwardBatch.__dataclass_fields__}

    def _forward(self, fb):
        """The model's forward as SGLang's model runner runs it: the backend's metadata for the batch, then the model,
        in 0.5.17 inside the ForwardContext its ModelRunner._forward_raw publishes (0.5.11 has no such context)."""
        try:
            from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
            scope = forward_context(ForwardContext(attn_backend=self.attn_backend))
        except ImportError:  # 0.5.11
            scope = contextlib.nullcontext()
        with scope:
            self.attn_backend.init_forward_metadata(fb)
            return self.model.forward(fb.input_ids, fb.positions, fb)

    def _tensor(self, values, dtype=torch.int64):
        return torch.tensor(values, dtype=dtype, device=self.device)

    def extend(self, sequences: list[list[int]], logprob_starts: list[int] | None = None):
        """One EXTEND forward of new sequences (no prefix). With `logprob_starts`, SGLang's input_token_logprobs
        path runs: row p >= start scores token p+1 (the last row gets id 0, as the scheduler pads it).
        Returns (LogitsProcessorOutput, [Seq], ForwardBatch)."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

        lens = [len(s) for s in sequences]
        seqs = [Seq(self._free_rows.pop(0), self._alloc(n)) for n in lens]
        for s in seqs:
            self.req_to_token_pool.req_to_token[s.row, :len(s.slots)] = self._tensor(s.slots, torch.int32)
        positions = [p for n in lens for p in range(n)]
        fb = ForwardBatch(
            forward_mode=ForwardMode.EXTEND, batch_size=len(sequences),
            input_ids=self._tensor([t for s in sequences for t in s]),
            req_pool_indices=self._tensor([s.row for s in seqs]), seq_lens=self._tensor(lens),
            out_cache_loc=self._tensor([x for s in seqs for x in s.slots]), seq_lens_sum=sum(lens),
            seq_lens_cpu=torch.tensor(lens), positions=self._tensor(positions),
            extend_num_tokens=sum(lens), extend_seq_lens=self._tensor(lens, torch.int32),
            extend_prefix_lens=self._tensor([0] * len(lens), torch.int32),
            extend_start_loc=self._tensor([sum(lens[:i]) for i in range(len(lens))], torch.int32),
            extend_prefix_lens_cpu=[0] * len(lens), extend_seq_lens_cpu=lens,
            **self._pools(), capture_hidden_mode=CaptureHiddenMode.NULL)
        if logprob_starts is not None:
            fb.return_logprob = True
            fb.top_logprobs_nums = [0] * len(lens)
            fb.token_ids_logprobs = [None] * len(lens)
            fb.extend_logprob_start_lens_cpu = list(logprob_starts)
            fb.extend_input_logprob_token_ids_gpu = self._tensor(
                [t for s, st in zip(sequences, logprob_starts) for t in s[st + 1:] + [0]])
        return self._forward(fb), seqs, fb

    def decode(self, seqs: list[Seq], tokens: list[int]):
        """One DECODE step: each sequence gets its next token (written to a new KV slot)."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

        new = [self._alloc(1)[0] for _ in seqs]
        for s, slot in zip(seqs, new):
            self.req_to_token_pool.req_to_token[s.row, len(s.slots)] = slot
            s.slots.append(slot)
        lens = [len(s.slots) for s in seqs]
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=len(seqs), input_ids=self._tensor(tokens),
            req_pool_indices=self._tensor([s.row for s in seqs]), seq_lens=self._tensor(lens),
            out_cache_loc=self._tensor(new), seq_lens_sum=sum(lens), seq_lens_cpu=torch.tensor(lens),
            positions=self._tensor([n - 1 for n in lens]), **self._pools(), capture_hidden_mode=CaptureHiddenMode.NULL)
        return self._forward(fb), fb

    def sample(self, logits_output, temperatures: list[float], seeds: list[int], positions: torch.Tensor,
               token_ids: list[int] | None = None):
        """SGLang's Sampler in rl mode (simple case: top_p=1, top_k=all, min_p=0). Returns (sampled ids, their
        log-probs); with `token_ids`, also the sampler's log-prob of those ids (SGLang's token_ids_logprobs)."""
        from sglang.srt.layers.sampler import Sampler
        from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
        from sglang.srt.sampling.sampling_params import TOP_K_ALL

        n = len(temperatures)
        # 0.5.17 added a required is_any_greedy (no temperature here is 0); 0.5.11 has no such field
        any_greedy = {"is_any_greedy": False} if "is_any_greedy" in SamplingBatchInfo.__dataclass_fields__ else {}
        info = SamplingBatchInfo(
            temperatures=torch.tensor(temperatures, dtype=torch.float32, device=self.device)[:, None],
            top_ps=torch.ones(n, dtype=torch.float32, device=self.device),
            top_ks=torch.full((n,), TOP_K_ALL, dtype=torch.int32, device=self.device),
            min_ps=torch.zeros(n, dtype=torch.float32, device=self.device), is_all_greedy=False, **any_greedy,
            need_top_p_sampling=False, need_top_k_sampling=False, need_min_p_sampling=False,
            vocab_size=self.vocab_size, sampling_seed=self._tensor(seeds), device=self.device)
        want = None if token_ids is None else [[t] for t in token_ids]
        ids = Sampler()(logits_output, info, True, [0] * n, want or [None] * n, positions)
        picked = None
        if want is not None:
            picked = [float(v[0]) for v in logits_output.next_token_token_ids_logprobs_val]
        return ids.tolist(), logits_output.next_token_logprobs, picked
