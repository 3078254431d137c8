"""DAPO-Math-17k: competition math with integer-style answers; the reward checks the final "Answer:" line.

Rows come from a local file (.parquet, .jsonl or .json) or, only when no path is given, from the Hugging Face
dataset `BytedTsinghua-SIA/DAPO-Math-17k` (needs network). A row is the verl RL format the dataset ships:
`prompt` (a list of chat messages, or a string), `reward_model.ground_truth`; plain `question`/`answer` rows
are accepted too. The published parquet repeats every prompt ~100 times, so rows are de-duplicated by prompt.

Reward: 1.0 when the response's final answer equals the gold answer, else 0.0. The answer is the text after the
last "Answer:" (the dataset's instruction), else the last \\boxed{}. `math-verify` (a dependency) decides
equivalence; as a fast path, and where it is missing, answers are compared after normalisation (LaTeX wrappers,
spaces, units of degrees/percent removed) and as exact fractions when both are numbers.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from top_rl.tasks import sources
from top_rl.tasks.rows import read_rows
from top_rl.tasks.base import MAX_ROW_BYTES, ON_BAD_ROW, HFTokenizerTask, PromptItem, TaskConfig, choice_errors, row_too_long
from top_rl.tasks.gsm8k import _last_boxed

HF_DATASET = "BytedTsinghua-SIA/DAPO-Math-17k"


@dataclass
class DapoConfig(TaskConfig):
    name: str = "dapo"
    path: str | None = None  # .parquet / .jsonl / .json; None -> datasets.load_dataset(hf_dataset)
    hf_dataset: str = HF_DATASET  # the Hugging Face dataset read when path is None
    split: str = "train"  # the dataset split
    tokenizer: str | None = None  # HF model name/dir for AutoTokenizer, unless a tokenizer is passed
    dedupe: bool = True  # the published file repeats each prompt ~100 times
    max_prompts: int = 0  # 0: all
    on_bad_row: str = "error"  # "error" | "skip"
    max_row_bytes: int = MAX_ROW_BYTES  # a longer row is a bad row, refused unparsed in .jsonl (tasks/base.py)
    use_chat_template: bool = True  # format prompts with the tokenizer's chat template
    # extra arguments of the chat template, e.g. enable_thinking
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    use_math_verify: bool = True  # when the `math-verify` package is installed

    def errors(self) -> list[str]:
        return choice_errors("on_bad_row", self.on_bad_row, ON_BAD_ROW)


# ------------------------------------------------------------------------------------ answers
_ANSWER = re.compile(r"Answer\s*[:：]\s*(.+)", re.IGNORECASE)
_STRIP = [r"\\left", r"\\right", r"\\!", r"\\,", r"\\;", r"\\ ", r"\^\{?\\circ\}?", r"\\%", "%", r"\\\$", r"\$",
          r"\\displaystyle", r"\s+"]


def extract_answer(text: str) -> str | None:
    """The text after the last "Answer:" (to the end of that line), else the last \\boxed{...}."""
    hits = _ANSWER.findall(text)
    if hits:
        ans = hits[-1].strip()
        boxed = _last_boxed(ans)
        return boxed if boxed is not None else ans
    return _last_boxed(text)


def normalize(ans: str) -> str:
    s = ans.strip()
    while True:  # unwrap \boxed{...} and \text{...}
        m = re.fullmatch(r"\\(?:boxed|text|textbf|mathrm)\{(.*)\}", s)
        if not m:
            break
        s = m.group(1).strip()
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\text\{\s*[a-zA-Z ]*\}$", "", s)  # a trailing unit: "5 \text{ cm}"
    for pat in _STRIP:
        s = re.sub(pat, "", s)
    return s.rstrip(".").strip()


def as_number(s: str) -> Fraction | None:
    s = s.replace(",", "").replace("{", "").replace("}", "") if re.fullmatch(r"[\d,.\-{}]+", s) else s
    m = re.fullmatch(r"(-?)\\frac\{?(-?\d+)\}?\{?(\d+)\}?", s)
    try:
        if m:
            v = Fraction(int(m.group(2)), int(m.group(3)))
            return -v if m.group(1) else v
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def equivalent(pred: str, gold: str) -> bool:
    """Normalised string or exact numeric equality (the math-verify-free check)."""
    p, g = normalize(pred), normalize(gold)
    if p == g:
        return True
    a, b = as_number(p), as_number(g)
    return a is not None and a == b


def math_verify_equivalent(pred: str, gold: str) -> bool | None:
    """math-verify's verdict; None when the package is not installed."""
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    if len(pred) > 300:  # parsing cost grows fast with length; a final answer is short
        return False
    # math-verify's timeouts use signal.alarm, which works only on the main thread (Ray actors run tasks on
    # others): there they are turned off, which is safe for the short strings passed here.
    kw = {} if threading.current_thread() is threading.main_thread() else {"parsing_timeout": None}
    try:
        g, p = parse(f"${gold}$", **kw), parse(f"${pred}$", **kw)
        return bool(verify(g, p, **({} if not kw else {"timeout_seconds": None})))
    except Exception:
        return False


# ------------------------------------------------------------------------------------ rows
def _messages(row: dict) -> list[dict] | None:
    prompt = row.get("prompt", row.get("question", row.get("problem")))
    if isinstance(prompt, str) and prompt.strip():
        return [{"role": "user", "content": prompt.strip()}]
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                   for m in prompt):
        return [{"role": m.get("role", "user"), "content": m["content"]} for m in prompt]
    return None


def _gold(row: dict) -> str | None:
    rm = row.get("reward_model")
    gold = rm.get("ground_truth") if isinstance(rm, dict) else row.get("answer", row.get("solution"))
    if isinstance(gold, (int, float)) and not isinstance(gold, bool):
        gold = str(gold)
    return gold.strip() if isinstance(gold, str) and gold.strip() else None


class DapoTask(HFTokenizerTask):
    name = "dapo"

    def __init__(self, cfg: DapoConfig | None = None, tokenizer: Any = None):
        self.cfg = cfg = cfg or DapoConfig()
        if tokenizer is None:
            if cfg.tokenizer is None:
                raise ValueError("dapo needs a tokenizer: pass one or set task.tokenizer=<HF name or dir>")
            tokenizer = sources.load_hf_tokenizer(cfg.tokenizer)
        self._tok = tokenizer
        self.skipped = 0  # rows dropped under on_bad_row="skip"
        self.duplicates = 0  # rows dropped by dedupe
        self.rows: list[tuple[list[dict], str]] = []  # (messages, gold)
        self._load()

    def _load(self) -> None:
        if self.cfg.path is None:
            try:
                import datasets  # network: never reached in tests, which always pass a path
            except ImportError:
                raise ImportError(f"task.path=null loads {self.cfg.hf_dataset} from the hub with datasets: "
                                  "pip install -e '.[math]' (the math extra), or set task.path") from None
            ds = datasets.load_dataset(self.cfg.hf_dataset, split=self.cfg.split)
            pairs = ((f"{self.cfg.hf_dataset}[{self.cfg.split}] row {i}", r) for i, r in enumerate(ds))
        else:
            pairs = iter(read_rows(self.cfg.path, self.cfg.max_row_bytes))
        seen: set[str] = set()
        for where, row in pairs:
            if self.cfg.max_prompts and len(self.rows) >= self.cfg.max_prompts:
                break
            msgs = _messages(row) if isinstance(row, dict) else None
            gold = _gold(row) if isinstance(row, dict) else None
            size = sum(len(m["content"].encode("utf-8", "replace")) for m in msgs or []) + len((gold or "").encode())
            if msgs is not None and gold is not None and size > self.cfg.max_row_bytes:  # parsed (.json, parquet, hub)
                row, msgs = row_too_long(size, self.cfg.max_row_bytes), None  # but never tokenized
            if msgs is None or gold is None:
                why = str(row) if isinstance(row, Exception) else "needs a 'prompt' (messages or text) and a gold answer"
                if self.cfg.on_bad_row == "error":
                    raise ValueError(f"{where}: {why} (set on_bad_row=skip to drop such rows)")
                self.skipped += 1
                continue
            key = json.dumps(msgs, sort_keys=True)
            if self.cfg.dedupe and key in seen:
                self.duplicates += 1
                continue
            seen.add(key)
            self.rows.append((msgs, gold))

    def __len__(self) -> int:
        return len(self.rows)

    def format_prompt(self, messages: list[dict]) -> tuple[str, list[int]]:
        tok = self._tok
        if self.cfg.use_chat_template and getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                           **self.cfg.chat_template_kwargs)
            return text, tok(text, add_special_tokens=False)["input_ids"]  # the template wrote the specials
        text = "\n\n".join(m["content"] for m in messages)
        return text, tok(text)["input_ids"]

    def item(self, uid: int) -> PromptItem:
        msgs, gold = self.rows[uid]
        text, ids = self.format_prompt(msgs)
        return PromptItem(uid, text, list(ids), gold)

    def reward(self, item: PromptItem, response_text: str) -> float:
        pred = extract_answer(response_text)
        if pred is None:
            return 0.0
        if equivalent(pred, item.answer):
            return 1.0
        verdict = math_verify_equivalent(pred, item.answer) if self.cfg.use_math_verify else None
        return 1.0 if verdict else 0.0
