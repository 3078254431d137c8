"""The DAPO-Math task on a few handmade rows in the dataset's own (verl RL) format: loading, de-duplication,
bad rows, prompts, and the reward with and without math-verify."""

from __future__ import annotations

import json

import pytest

from top_rl.tasks import get_task
from top_rl.tasks.dapo import DapoConfig, DapoTask, equivalent, extract_answer, math_verify_equivalent

INSTR = ("Solve the following math problem step by step. The last line of your response should be of the form "
         "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{q}\n\n"
         "Remember to put your answer on its own line after \"Answer:\".")


def _row(q, gold):
    return {"data_source": "math_dapo", "prompt": [{"content": INSTR.format(q=q), "role": "user"}], "ability": "MATH",
            "reward_model": {"ground_truth": gold, "style": "rule-lighteval/MATH_v2"}, "extra_info": {"index": q}}


ROWS = [_row("What is 6*7?", "42"), _row("What is 6*7?", "42"),  # the published file repeats prompts
        _row("Half of 1?", "\\frac{1}{2}"), {"question": "Angle of a right angle in degrees?", "answer": "90"}]


class CharTokenizer:
    """A character-level stand-in for an HF tokenizer (what the task calls of one)."""
    eos_token_id, pad_token_id, chat_template = 1, None, None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": ([0] if add_special_tokens else []) + [ord(c) + 2 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i - 2) for i in ids if i >= 2)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<assistant>" if add_generation_prompt else "")

    def __len__(self):
        return 0x110000 + 2


@pytest.fixture
def rows_file(tmp_path):
    p = tmp_path / "dapo.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    return p


def test_load_dedupe_and_prompts(rows_file):
    tok = CharTokenizer()
    task = get_task("dapo", {"path": str(rows_file)}, tokenizer=tok)
    assert len(task) == 3 and task.duplicates == 1 and task.skipped == 0
    it = task.item(0)
    assert it.answer == "42" and it.prompt.startswith("Solve the following") and "What is 6*7?" in it.prompt
    assert tok.decode(it.prompt_ids) == it.prompt and it.prompt_ids[0] == 0
    assert task.item(2).prompt == "Angle of a right angle in degrees?"  # plain question/answer rows work too
    assert len(DapoTask(DapoConfig(path=str(rows_file), dedupe=False), tokenizer=tok)) == 4
    assert len(DapoTask(DapoConfig(path=str(rows_file), max_prompts=2), tokenizer=tok)) == 2
    tok.chat_template = "x"
    try:
        assert DapoTask(DapoConfig(path=str(rows_file)), tokenizer=tok).item(0).prompt.startswith("<user>Solve")
    finally:
        tok.chat_template = None


def test_bad_rows(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(ROWS[0]) + "\n{nope\n" + json.dumps({"prompt": "q"}) + "\n")
    with pytest.raises(ValueError, match=rf"{p}:2: invalid JSON"):
        DapoTask(DapoConfig(path=str(p)), tokenizer=CharTokenizer())
    t = DapoTask(DapoConfig(path=str(p), on_bad_row="skip"), tokenizer=CharTokenizer())
    assert len(t) == 1 and t.skipped == 2
    with pytest.raises(ValueError, match="needs a tokenizer"):
        DapoTask(DapoConfig(path=str(p)))


def test_parquet_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    p = tmp_path / "dapo.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS[:3]), p)
    task = DapoTask(DapoConfig(path=str(p)), tokenizer=CharTokenizer())
    assert len(task) == 2 and task.item(1).answer == "\\frac{1}{2}"


def test_extract_and_fallback_match():
    assert extract_answer("work...\nAnswer: 42") == "42"
    assert extract_answer("Answer: 1\nno wait\nAnswer: $\\boxed{7}$") == "7"  # the last one counts
    assert extract_answer("so \\boxed{\\frac{3}{4}}") == "\\frac{3}{4}" and extract_answer("no answer") is None
    for pred, gold in [("42", "42"), ("42.0", "42"), ("1,000", "1000"), ("$5$", "5"), ("\\boxed{12}", "12"),
                       ("0.5", "\\frac{1}{2}"), ("\\dfrac{1}{2}", "\\frac{1}{2}"), ("-\\frac{3}{4}", "-0.75"),
                       ("45^\\circ", "45"), ("20\\%", "20"), ("5 \\text{ cm}", "5"), ("x + 1", "x+1"), ("7.", "7")]:
        assert equivalent(pred, gold), (pred, gold)
    for pred, gold in [("41", "42"), ("\\frac{1}{3}", "0.5"), ("x", "y"), ("", "0")]:
        assert not equivalent(pred, gold), (pred, gold)


def test_reward_without_math_verify(rows_file):
    task = DapoTask(DapoConfig(path=str(rows_file), use_math_verify=False), tokenizer=CharTokenizer())
    it = task.item(0)
    assert task.reward(it, "6*7 = 42.\nAnswer: 42") == 1.0
    assert task.reward(it, "Answer: 41") == 0.0 and task.reward(it, "42") == 0.0  # no final answer line
    half = task.item(1)
    assert task.reward(half, "Answer: 0.5") == 1.0 and task.reward(half, "Answer: 1/2") == 1.0
    assert task.reward(half, "Answer: \\sqrt{1/4}") == 0.0  # beyond normalisation: math-verify's job


def test_reward_with_math_verify(rows_file):
    import math_verify  # noqa: F401 - a dependency (pyproject): its absence fails here, never skips
    task = DapoTask(DapoConfig(path=str(rows_file)), tokenizer=CharTokenizer())
    half = task.item(1)
    assert task.reward(half, "Answer: \\sqrt{1/4}") == 1.0 and task.reward(half, "Answer: 0.25") == 0.0
    assert math_verify_equivalent("2\\sqrt{2}", "\\sqrt{8}") is True


def test_over_long_rows_are_refused_before_tokenizing(tmp_path):
    """Issue 24 (6d): .jsonl rows over task.max_row_bytes are refused unparsed; rows of a .json file (parsed whole,
    as the format is) are refused by size before any tokenizer sees them."""
    big = _row("x" * 5000, "1")
    lines = tmp_path / "big.jsonl"
    lines.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(big) + "\n")
    with pytest.raises(ValueError, match=rf"{lines}:2: row is {len(json.dumps(big)):,} bytes, over task.max_row_bytes="
                                         "4,096: refused unparsed"):
        DapoTask(DapoConfig(path=str(lines), max_row_bytes=4096), tokenizer=CharTokenizer())
    whole = tmp_path / "big.json"
    whole.write_text(json.dumps([ROWS[0], big]))
    size = len(big["prompt"][0]["content"]) + 1
    with pytest.raises(ValueError, match=rf"{whole} row 1: row is {size:,} bytes, over task.max_row_bytes=4,096"):
        DapoTask(DapoConfig(path=str(whole), max_row_bytes=4096), tokenizer=CharTokenizer())
    assert len(DapoTask(DapoConfig(path=str(whole), max_row_bytes=4096, on_bad_row="skip"),
                        tokenizer=CharTokenizer())) == 1
    assert len(DapoTask(DapoConfig(path=str(whole)), tokenizer=CharTokenizer())) == 2  # under the default 1 MiB
