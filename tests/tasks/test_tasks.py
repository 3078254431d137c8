import json
import random
import tracemalloc
from pathlib import Path

import pytest

from top_rl.tasks import DataPosition, get_task
from top_rl.tasks.arith import VOCAB_SIZE, ArithConfig, ArithTask
from top_rl.tasks.gsm8k import Gsm8kConfig, Gsm8kTask, extract_lenient, strict_match

# The steering repo's shared/ lies beside the checkout (and beside CI's clone); /work/shared on this machine.
GSM = next((p for p in (Path(__file__).resolve().parents[2] / "shared/data/gsm8k/test.jsonl",
                        Path("/work/shared/data/gsm8k/test.jsonl")) if p.is_file()),
           Path("../shared/data/gsm8k/test.jsonl"))


# ---------------------------------------------------------------- arith
def test_arith_items_tokenizer_and_reward():
    t = get_task("arith", {"max_operand": 4})
    assert t.vocab_size == VOCAB_SIZE == 18
    for uid in range(200):
        it = t.item(uid)
        a, b = it.prompt[:-1].split("+")
        assert it.answer == str(int(a) + int(b)) and 0 <= int(it.answer) <= 8
        assert it.prompt_ids[0] == t.bos_token_id and t.decode(it.prompt_ids) == it.prompt
        ans_ids = t.encode(it.answer)
        assert t.reward(it, t.response_text(ans_ids + [t.eos_token_id, 5, 6])) == 1.0
        assert t.reward(it, t.response_text(ans_ids + t.encode("1"))) == 0.0  # "exact": no trailing junk
        assert t.reward(it, it.answer + "<eos>") == 1.0
        # special tokens other than eos stay in the text: padding a right answer is not rewarded
        assert t.reward(it, t.response_text([t.pad_token_id] + ans_ids + [t.eos_token_id])) == 0.0
        assert t.reward(it, t.response_text(ans_ids + [t.bos_token_id])) == 0.0
    assert t.encode("12+7=") == [5, 6, 14, 11, 17]  # one token per character
    assert t.item(7) == ArithTask(ArithConfig()).item(7)  # pure function of (data_seed, uid)
    other = ArithTask(ArithConfig(data_seed=1))
    assert [other.item(u).prompt for u in range(20)] != [t.item(u).prompt for u in range(20)]


def test_arith_ops_difficulty_and_leading_number():
    t = ArithTask(ArithConfig(ops="-*", min_operand=2, max_operand=30, reward_mode="leading_number"))
    seen = set()
    for uid in range(300):
        it = t.item(uid)
        op = "-" if "-" in it.prompt else "*"
        seen.add(op)
        a, b = map(int, it.prompt[:-1].split(op))
        assert 2 <= min(a, b) and max(a, b) <= 30
        assert int(it.answer) == (a - b if op == "-" else a * b) >= 0
        assert t.reward(it, it.answer + "+3") == 1.0 and t.reward(it, it.answer + "7") == 0.0
    assert seen == {"-", "*"}
    from omegaconf import OmegaConf  # Hydra hands the config over as a DictConfig
    assert get_task("arith", OmegaConf.create({"max_operand": 1})).cfg.max_operand == 1
    with pytest.raises(ValueError, match=r"task.ops='/' must be a non-empty subset of '\+-\*'"):
        get_task("arith", ArithConfig(ops="/"))  # the config's own rule (ArithConfig.errors), not the constructor's
    with pytest.raises(ValueError, match="unknown config keys"):
        get_task("arith", {"max_operands": 3})


def test_resumable_deterministic_order():
    t = ArithTask(ArithConfig(num_prompts=10))
    full, pos = t.batch(25, seed=3)  # crosses two epoch boundaries
    assert pos == DataPosition(2, 5)
    assert sorted(i.uid for i in full[:10]) == list(range(10))  # an epoch is a permutation
    assert [i.uid for i in full[:10]] != [i.uid for i in full[10:20]]  # reshuffled per epoch
    a, p = t.batch(7, seed=3)
    b, p = t.batch(18, seed=3, start=DataPosition.from_state_dict(p.state_dict()))
    assert [i.uid for i in a + b] == [i.uid for i in full] and p == pos
    assert [i.uid for i in t.batch(10, seed=4)[0]] != [i.uid for i in full[:10]]


def test_arith_tokenizer_roundtrip_and_hf_load(tmp_path):
    t = ArithTask()
    t.save_tokenizer(str(tmp_path))
    t2 = ArithTask(tokenizer_dir=str(tmp_path))
    assert t2.encode("3*4=") == t.encode("3*4=") and t2.eos_token_id == t.eos_token_id
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf("3*4=", add_special_tokens=False)["input_ids"] == t.encode("3*4=")
    assert (hf.eos_token_id, hf.pad_token_id, hf.bos_token_id, len(hf)) == (2, 0, 1, 18)


# ---------------------------------------------------------------- gsm8k
@pytest.fixture(scope="module")
def hf_tok():
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    lines = [json.loads(x)["question"] for x in GSM.read_text().splitlines()[:300]]
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>")


# (response, reward against gold 1234, what the strict-match filter keeps of it). Expectations derived by running lm-eval
# 0.4.13's own code on each response: its RegexFilter and TakeFirstFilter configured from the strict-match entry of
# lm_eval/tasks/gsm8k/gsm8k.yaml, then exact_match_hf_evaluate with that yaml's metric arguments, the reference
# being the full solution "Some reasoning.\n#### 1234" (lm-eval itself is not a dependency: nothing is imported).
LM_EVAL_STRICT_MATCH = [
    ("#### 1234", 1.0, "1234"),
    ("####1234", 0.0, "[invalid]"),  # exactly one space after the marker
    ("####  1234", 0.0, "[invalid]"),
    ("####\t1234", 0.0, "[invalid]"),
    ("#### $1,234", 0.0, "[invalid]"),  # no $ inside the match
    ("#### $1234", 0.0, "[invalid]"),
    ("#### 1234.00", 0.0, "1234.00"),  # compared as strings
    ("#### 1234.0", 0.0, "1234.0"),
    ("#### 1234.", 1.0, "1234."),  # one trailing dot removed
    ("#### 1234..", 0.0, "1234.."),
    ("#### 1234\n#### 5", 1.0, "1234"),  # the first match
    ("#### 5\n#### 1234", 0.0, "5"),
    ("####1234\n#### 1234", 1.0, "1234"),
    ("#### x\n#### 1234", 1.0, "1234"),
    ("#### 1,234", 1.0, "1,234"),  # commas removed anywhere
    ("#### 12,34", 1.0, "12,34"),
    ("#### 1,2,3,4", 1.0, "1,2,3,4"),
    ("#### 1234,", 1.0, "1234,"),
    ("#### 01234", 0.0, "01234"),
    ("#### -1234", 0.0, "-1234"),
    ("#### +1234", 0.0, "[invalid]"),
    ("#### .1234", 0.0, ".1234"),
    ("#### 1234.5", 0.0, "1234.5"),
    ("#### 1 234", 0.0, "1"),
    ("##### 1234", 1.0, "1234"),
    ("# ### 1234", 0.0, "[invalid]"),
    ("#### 1234 dollars", 1.0, "1234"),
    ("#### 1234/1", 1.0, "1234"),
    ("#### 1234\n", 1.0, "1234"),
    ("The answer is 1234.", 0.0, "[invalid]"),
    ("\\boxed{1234}", 0.0, "[invalid]"),
    ("", 0.0, "[invalid]"),
]


@pytest.mark.parametrize("response,reward,extracted", LM_EVAL_STRICT_MATCH)
def test_strict_reward_is_lm_eval_strict_match(hf_tok, tmp_path, response, reward, extracted):
    """Issue 24: the default grades exactly as lm-eval's gsm8k strict-match (table above)."""
    p = tmp_path / "one.jsonl"
    p.write_text(json.dumps({"question": "How many?", "answer": "Some reasoning.\n#### 1234"}) + "\n")
    task = Gsm8kTask(Gsm8kConfig(path=str(p)), tokenizer=hf_tok)
    assert strict_match(response) == extracted
    assert task.reward(task.item(0), response) == reward


def test_strict_gold_and_modes(hf_tok, tmp_path):
    p = tmp_path / "rows.jsonl"
    rows = [{"question": "a?", "answer": "so\n#### 1,234"}, {"question": "b?", "answer": "so\n####42"}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = Gsm8kTask(Gsm8kConfig(path=str(p), on_bad_row="skip"), tokenizer=hf_tok)
    assert [task.item(i).answer for i in range(len(task))] == ["1234"] and task.skipped == 1  # no `#### ` in row 2
    assert "one space after '####'" in task.skipped_rows[0] and task.skipped_rows[0].startswith(f"{p}:2: ")
    lenient = Gsm8kTask(Gsm8kConfig(path=str(p), reward_mode="lenient_last_number"), tokenizer=hf_tok)
    it = lenient.item(0)
    assert lenient.reward(it, "I think 41 or 1234") == 1.0 and lenient.reward(it, "#### $1,234.00") == 1.0
    assert len(lenient) == 2  # lenient reads `####42` as 42
    with pytest.raises(ValueError, match="task.reward_mode='loose'; choose one of: strict, lenient_last_number"):
        get_task("gsm8k", Gsm8kConfig(path=str(p), reward_mode="loose"), tokenizer=hf_tok)


def test_extract_lenient():
    F = extract_lenient
    assert F("so \\boxed{1,234} but 7") == 1234
    assert F("blah \\boxed{\\$18.00} then 99") == 18
    assert F("x = 3\n#### 42") == 42 and F("The answer is: $7.5 dollars") == 7.5
    assert F("Answer: -3\nsome 12 later") == -3
    assert F("we get 5 then 6.") == 6 and F("no number") is None


def test_gsm8k_gold_scores_one_shuffled_near_zero(hf_tok):
    task = get_task("gsm8k", {"path": str(GSM)}, tokenizer=hf_tok)
    n = len(task)
    assert n == 1319 and task.skipped == 0
    items = [task.item(i) for i in range(n)]
    assert all(task.reward(items[i], task.solution(i)) == 1.0 for i in range(n))
    perm = list(range(n))
    random.Random(0).shuffle(perm)
    shuffled = sum(task.reward(items[i], task.solution(perm[i])) for i in range(n) if perm[i] != i) / n
    assert shuffled < 0.05
    # no chat template on this tokenizer -> the plain template
    assert items[0].prompt.startswith("Question: Janet") and items[0].prompt.endswith("\nAnswer:")
    assert hf_tok.decode(items[0].prompt_ids) == items[0].prompt


def test_gsm8k_chat_template(hf_tok, tmp_path):
    hf_tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                            "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    try:
        task = Gsm8kTask(Gsm8kConfig(path=str(GSM)), tokenizer=hf_tok)
        it = task.item(1)
        assert it.prompt.startswith("<|im_start|>user\nA robe takes") and 'after "####"' in it.prompt
        assert it.prompt.endswith("<|im_start|>assistant\n")
        assert it.prompt_ids[0] == hf_tok.convert_tokens_to_ids("<|im_start|>")
        plain = Gsm8kTask(Gsm8kConfig(path=str(GSM), use_chat_template=False), tokenizer=hf_tok)
        assert plain.item(1).prompt.startswith("Question: A robe")
    finally:
        hf_tok.chat_template = None


def test_gsm8k_bad_rows(hf_tok, tmp_path):
    good = json.dumps({"question": "1+1?", "answer": "two\n#### 2"})
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join([good, "{not json", json.dumps({"question": "", "answer": "#### 1"}),
                            json.dumps({"question": "q", "answer": "no gold"}), "", good]) + "\n")
    with pytest.raises(ValueError, match=rf"{p}:2: invalid JSON"):
        Gsm8kTask(Gsm8kConfig(path=str(p)), tokenizer=hf_tok)
    t = Gsm8kTask(Gsm8kConfig(path=str(p), on_bad_row="skip"), tokenizer=hf_tok)
    assert len(t) == 2 and t.skipped == 4
    p.write_text(good + "\n" + json.dumps({"question": "q", "answer": "#### x"}) + "\n")
    with pytest.raises(ValueError, match=rf"{p}:2: .*####"):
        Gsm8kTask(Gsm8kConfig(path=str(p)), tokenizer=hf_tok)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        Gsm8kTask(Gsm8kConfig(path=str(p)))


def test_an_over_long_row_is_refused_unread(hf_tok, tmp_path):
    """Issue 24 (6d): a row longer than task.max_row_bytes is refused at its file:line without being held whole,
    decoded, parsed or tokenized, so memory stays bounded (an 8 MB line under a 64 KiB limit here; a 50 MB line
    under the default 1 MiB took 0.6 s and 4 MB over the interpreter's baseline, measured by hand)."""
    p = tmp_path / "long.jsonl"
    p.write_text(json.dumps({"question": "x" * (2 << 20), "answer": "#### 2"}) + "\n")
    with pytest.raises(ValueError, match=rf"{p}:1: row is 2,097,1\d\d bytes, over task.max_row_bytes=1,048,576"):
        Gsm8kTask(Gsm8kConfig(path=str(p)), tokenizer=hf_tok)  # the default limit
    good = json.dumps({"question": "1+1?", "answer": "two\n#### 2"})
    long_row = json.dumps({"question": "x" * (8 << 20), "answer": "#### 2"})
    p.write_text("\n".join([good, long_row, good, "{not json"]) + "\n")
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=rf"{p}:2: row is {len(long_row):,} bytes, over task.max_row_bytes="
                                             r"65,536: refused unparsed"):
            Gsm8kTask(Gsm8kConfig(path=str(p), max_row_bytes=1 << 16), tokenizer=hf_tok)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak  # the 8 MB line was never in memory
    t = Gsm8kTask(Gsm8kConfig(path=str(p), max_row_bytes=1 << 16, on_bad_row="skip"), tokenizer=hf_tok)
    assert len(t) == 2 and t.skipped == 2 and t.skipped_rows[1].startswith(f"{p}:4: invalid JSON")  # lines count on
    # the limit is on the row's bytes, its newline not counted: a row of exactly the limit loads
    p.write_text(good + "\n")
    assert len(Gsm8kTask(Gsm8kConfig(path=str(p), max_row_bytes=len(good)), tokenizer=hf_tok)) == 1
    with pytest.raises(ValueError, match=rf"{p}:1: row is {len(good)} bytes, over task.max_row_bytes={len(good) - 1}"):
        Gsm8kTask(Gsm8kConfig(path=str(p), max_row_bytes=len(good) - 1), tokenizer=hf_tok)
