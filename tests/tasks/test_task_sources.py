"""Shipped task resources (top_rl/tasks/sources.py): GSM8K's splits and Qwen3's tokenizer, so a GSM8K run needs no
download. The tokenizer is compared with the offline copy of Qwen's files where this machine has one."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from top_rl.tasks import sources
from top_rl.tasks.gsm8k import Gsm8kConfig, Gsm8kTask

SHARED_TOKENIZER = Path(__file__).resolve().parents[2] / "shared" / "data" / "qwen3-tokenizer"


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


@pytest.mark.skipif(not SHARED_TOKENIZER.exists(), reason="no offline copy of Qwen's tokenizer files on this machine")
def test_qwen3_alias_is_qwens_own_files():
    shipped = Path(sources.tokenizer_dir("qwen3"))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        assert (shipped / name).read_bytes() == (SHARED_TOKENIZER / name).read_bytes(), name


def test_other_tokenizer_names_pass_through():
    assert sources.tokenizer_dir("/models/Qwen3-0.6B") == "/models/Qwen3-0.6B"
