"""Where a task's data and tokenizer come from when the config names a shipped resource instead of a path, so a
run on a machine without network (a GPU node, CI) needs no download:
- GSM8K's train and test splits ship with the package (tasks/data/gsm8k/, MIT): `task.path: null` reads them;
- `task.tokenizer: qwen3` is Qwen3's own tokenizer (byte-level BPE, 151,669 tokens, its chat template), built from
  Qwen's files shipped with the package (tasks/data/qwen3_tokenizer/, Apache-2.0: its README says why they are shipped
  and not a dependency); any other value is an HF name or dir.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
QWEN3_TOKENIZER = "qwen3"


def gsm8k_split(split: str) -> str:
    path = DATA / "gsm8k" / f"{split}.jsonl.gz"
    if not path.exists():
        have = sorted(p.name.split(".")[0] for p in (DATA / "gsm8k").glob("*.jsonl.gz"))
        raise ValueError(f"task.split={split!r}: the shipped GSM8K has {have}; or set task.path to a JSONL file")
    return str(path)


# Qwen's tokenizer.json is shipped gzipped (11.4 MB -> 2.1 MB: the working tree travels with every GPU call, whose
# carry is capped), beside its tokenizer_config.json, byte for byte as a Qwen3 checkpoint carries them.
QWEN3_DIR = DATA / "qwen3_tokenizer"


def qwen3_tokenizer_json() -> bytes:
    """The bytes of Qwen3's tokenizer.json (tests pin their SHA-256)."""
    return gzip.decompress((QWEN3_DIR / "tokenizer.json.gz").read_bytes())


def load_hf_tokenizer(name: str):
    """transformers' tokenizer for `name` (an HF name or dir); `qwen3` builds Qwen3's from the shipped files in memory,
    so nothing is unpacked to disk (a run writes only under run_dir) and no hub is asked."""
    import transformers
    from transformers import AutoTokenizer

    if name != QWEN3_TOKENIZER:
        return AutoTokenizer.from_pretrained(name)
    from tokenizers import Tokenizer

    cfg = json.loads((QWEN3_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))
    cls = getattr(transformers, cfg.pop("tokenizer_class"))  # Qwen2Tokenizer, as AutoTokenizer would pick
    # tokenizer.json already holds the added tokens (with their special flags); the config's copy of them is a dict of
    # dicts that __init__ would hand to add_tokens as is (a TypeError), so it is left out.
    cfg.pop("added_tokens_decoder", None)
    return cls(tokenizer_object=Tokenizer.from_str(qwen3_tokenizer_json().decode("utf-8")), **cfg)
