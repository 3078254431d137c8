"""Dense Qwen3 over the kernel seam, with Hugging Face checkpoint I/O."""

from top_rl.model.config import NotDenseQwen3, Qwen3Config
from top_rl.model.hf_io import hf_state_dict, load_hf_state_dict, load_model, save_model
from top_rl.model.qwen3 import KVCache, Qwen3, pack, packed_positions, sequence_logprobs

__all__ = [
    "KVCache", "NotDenseQwen3", "Qwen3", "Qwen3Config", "hf_state_dict", "load_hf_state_dict", "load_model",
    "pack", "packed_positions", "save_model", "sequence_logprobs",
]
