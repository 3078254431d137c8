"""GSM8K: grade-school math word problems; the gold answer is the number after ``####``.

Rows come from a JSONL file (``question``, ``answer`` fields) or, when no path is given, from the copy of
``openai/gsm8k`` shipped with the package (top_rl/tasks/data/gsm8k/, ``task.split`` train or test). The reward is
1.0 when the response's final answer equals the gold answer, else 0.

Which text is the final answer (``task.reward_mode``):
  strict               (default) lm-eval's GSM8K strict-match, exactly (its gsm8k task, v3.0, as lm-eval 0.4.13
                       ships it): the FIRST ``#### <number>`` (one space after the marker; digits, dots and
                       commas, an optional minus; no ``$``), its commas and one trailing dot removed, equal as
                       a string to the gold after the last ``#### `` (so "1234.00" is not 1234). A response
                       without it scores 0, so accuracies compare with lm-eval's strict-match numbers.
  lenient_last_number  forgiving extraction (not comparable with published numbers): the last
                       ``\\boxed{}``, else the last ``####`` / ``Answer:``, else the last number anywhere
                       in the text ("41 or 42" counts as 42), compared as fractions ("18.00" == "18").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from top_rl.tasks import sources
from top_rl.tasks.base import (MAX_ROW_BYTES, ON_BAD_ROW, HFTokenizerTask, PromptItem, TaskConfig, choice_errors,
                               row_too_long, text_lines)

_NUM = r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+"
# lm-eval's strict-match (lm_eval/tasks/gsm8k/gsm8k.yaml): its `regex` filter takes the first match of this
# pattern (else "[invalid]"); its exact_match then deletes these patterns, in this order, from both the
# prediction and the reference (the gold's full solution text) and compares the strings, case-insensitively.
_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_STRICT_IGNORE = tuple(re.compile(p) for p in (",", r"\$", r"(?s).*#### ", r"\.$"))
STRICT_INVALID = "[invalid]"
REWARD_MODES = ("strict", "lenient_last_number")


@dataclass
class Gsm8kConfig(TaskConfig):
    name: str = "gsm8k"
    path: str | None = None  # JSONL file (.gz too); None -> the shipped openai/gsm8k copy (tasks/sources.py)
    split: str = "train"  # only for the shipped copy: train | test
    tokenizer: str | None = None  # HF model name/dir for AutoTokenizer, or `qwen3` (shipped; tasks/sources.py)
    on_bad_row: str = "error"  # "error": raise naming file and line; "skip": drop and count
    max_row_bytes: int = MAX_ROW_BYTES  # a longer row is a bad row, refused unparsed (tasks/base.py)
    reward_mode: str = "strict"  # strict (lm-eval's strict-match) | lenient_last_number (see module doc)
    use_chat_template: bool = True  # when the tokenizer has one; else the plain template
    # asks for the form the strict reward grades (the instruction verl's GSM8K preprocessing uses)
    instruction: str = "Let's think step by step and output the final answer after \"####\"."
    plain_template: str = "Question: {question}\nAnswer:"  # the prompt without a chat template ({question} is replaced)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. enable_thinking

    def errors(self) -> list[str]:
        return choice_errors("on_bad_row", self.on_bad_row, ON_BAD_ROW) + \
            choice_errors("reward_mode", self.reward_mode, REWARD_MODES)


def to_number(s: str) -> Fraction | None:
    s = s.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def _last_boxed(text: str) -> str | None:
    i = text.rfind("\\boxed{")
    if i < 0:
        return None
    depth, j = 0, i + len("\\boxed")
    for k in range(j, len(text)):  # balanced braces: \boxed{\frac{1}{2}} stays whole
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        if depth == 0:
            return text[j + 1:k]
    return None


def _strict_normalize(text: str) -> str:
    for pattern in _STRICT_IGNORE:
        text = pattern.sub("", text)
    return text.lower()


def strict_match(text: str) -> str:
    """What lm-eval's strict-match filter keeps of a response: its first ``#### <number>``, else "[invalid]"."""
    hit = _STRICT.search(text)
    return hit.group(1).strip() if hit else STRICT_INVALID


def strict_answer(text: str) -> str:
    """A response's answer as lm-eval's strict-match compares it with the gold."""
    return _strict_normalize(strict_match(text))


def strict_gold(solution: str) -> str:
    """A GSM8K solution's gold as lm-eval's strict-match compares it (the text after its last ``#### ``)."""
    return _strict_normalize(solution)


def extract_lenient(text: str) -> Fraction | None:
    """Lenient (``reward_mode=lenient_last_number``): the last ``\\boxed{...}``, else the last ``#### x`` or
    ``Answer: x``, else the last number anywhere. Commas and $ are ignored."""
    candidates = []
    boxed = _last_boxed(text)
    if boxed is not None:
        candidates.append(boxed)
    for pat in (r"####\s*([^\n]*)", r"[Aa]nswer\s*(?:is)?\s*[:：]?\s*([^\n]*)"):
        hits = re.findall(pat, text)
        if hits:
            candidates.append(hits[-1])
    for c in candidates:
        nums = re.findall(_NUM, c.replace("$", ""))
        if nums:
            return to_number(nums[0])
    nums = re.findall(_NUM, text)
    return to_number(nums[-1]) if nums else None


def gold_answer(solution: str) -> str | None:
    if "####" not in solution:
        return None
    g = solution.rsplit("####", 1)[1].strip().replace(",", "").replace("$", "")
    return g if to_number(g) is not None else None


class Gsm8kTask(HFTokenizerTask):
    name = "gsm8k"

    def __init__(self, cfg: Gsm8kConfig | None = None, tokenizer: Any = None):
        self.cfg = cfg = cfg or Gsm8kConfig()
        if tokenizer is None:
            if cfg.tokenizer is None:
                raise ValueError("gsm8k needs a tokenizer: pass one or set task.tokenizer=<HF name or dir>")
            tokenizer = sources.load_hf_tokenizer(cfg.tokenizer)
        self._tok = tokenizer
        self.skipped = 0  # rows dropped under on_bad_row="skip"
        self.skipped_rows: list[str] = []  # "file:line: why" of the first skipped rows
        self.rows: list[tuple[str, str, str]] = []  # (question, full solution, gold as the reward compares it)
        self._load()

    def _bad(self, where: str, why: str) -> None:
        if self.cfg.on_bad_row == "error":
            raise ValueError(f"{where}: {why} (set task.on_bad_row=skip to drop such rows)")
        self.skipped += 1
        if len(self.skipped_rows) < 20:  # reported at start (top_rl.tasks.prompts.load_task); the count goes to metrics
            self.skipped_rows.append(f"{where}: {why}")

    def _add(self, where: str, row: Any) -> None:
        if not isinstance(row, dict):
            return self._bad(where, "row is not a JSON object")
        q, a = row.get("question"), row.get("answer")
        if not isinstance(q, str) or not q.strip() or not isinstance(a, str) or not a.strip():
            return self._bad(where, "missing or empty 'question'/'answer'")
        size = len(q.encode("utf-8", "replace")) + len(a.encode("utf-8", "replace"))
        if size > self.cfg.max_row_bytes:  # a row from the hub: parsed already, but never tokenized
            return self._bad(where, str(row_too_long(size, self.cfg.max_row_bytes)))
        gold = gold_answer(a)
        if gold is None:
            return self._bad(where, "'answer' has no numeric gold value after '####'")
        if self.cfg.reward_mode == "strict":
            gold = strict_gold(a)
            if not re.fullmatch(r"-?[0-9.]+", gold):  # no response could equal it: every sample would score 0
                return self._bad(where, "'answer' does not end in '#### <number>' (one space after '####'), "
                                        "the gold form strict grading reads")
        self.rows.append((q.strip(), a, gold))

    def _load(self) -> None:
        path = self.cfg.path or sources.gsm8k_split(self.cfg.split)  # None: the copy shipped with the package
        for where, line in text_lines(path, self.cfg.max_row_bytes):
            if isinstance(line, ValueError):
                self._bad(where, str(line))
                continue
            if not line.strip():
                self._bad(where, "empty line")
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                self._bad(where, f"invalid JSON ({e.msg})")
                continue
            self._add(where, row)

    def __len__(self) -> int:
        return len(self.rows)

    def format_prompt(self, question: str) -> tuple[str, list[int]]:
        tok = self._tok
        if self.cfg.use_chat_template and getattr(tok, "chat_template", None):
            content = f"{question} {self.cfg.instruction}".strip()
            text = tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                           add_generation_prompt=True, **self.cfg.chat_template_kwargs)
            # the template already wrote every special token; adding bos again would double it
            return text, tok(text, add_special_tokens=False)["input_ids"]
        text = self.cfg.plain_template.format(question=question)
        return text, tok(text)["input_ids"]

    def item(self, uid: int) -> PromptItem:
        q, _, gold = self.rows[uid]
        text, ids = self.format_prompt(q)
        return PromptItem(uid, text, list(ids), gold)

    def solution(self, uid: int) -> str:
        return self.rows[uid][1]

    def reward(self, item: PromptItem, response_text: str) -> float:
        if self.cfg.reward_mode == "strict":
            return 1.0 if strict_answer(response_text) == item.answer else 0.0
        pred = extract_lenient(response_text)
        return 1.0 if pred is not None and pred == Fraction(item.answer) else 0.0
