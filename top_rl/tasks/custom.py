"""`task=custom`: the user's data and reward, named on the command line, no code in this package to edit.

    top-rl task=custom task.path=data.jsonl task.prompt_key=question task.label_key=answer \\
        task.reward_fn=my_reward.py:score task.tokenizer=<model dir>

Rows come from `.jsonl` (`.gz` too), `.json` or `.parquet` (top_rl.tasks.rows). Each row gives the prompt
(`task.prompt_key`: a string, or a list of chat messages as verl's parquet files hold it), the label handed to the
reward as `ground_truth` (`task.label_key`; a dotted key such as `reward_model.ground_truth` reaches into a nested
object) and, optionally, `task.metadata_keys` handed to it as `extra_info`. A string prompt goes through
`task.prompt_template` and then the tokenizer's chat template (when it has one and `task.use_chat_template`), else
is tokenized raw. The reward is `task.reward_fn` (top_rl.tasks.reward_fn: verl's signature), imported once at start.

`task.tokenizer`: a Hugging Face name or directory (usually the model's own, model.path), `qwen3` (shipped), or
`arith`: the default CPU job's character tokenizer (digits and + - * =, anything else <unk>), for the tiny random
model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from top_rl.tasks import arith, reward_fn, sources
from top_rl.tasks.base import MAX_ROW_BYTES, ON_BAD_ROW, PromptItem, Task, TaskConfig, choice_errors
from top_rl.tasks.rows import FORMATS, read_rows

ARITH_TOKENIZER = "arith"


@dataclass
class CustomConfig(TaskConfig):
    name: str = "custom"
    path: str | None = None  # the data file: .jsonl / .jsonl.gz / .json / .parquet
    prompt_key: str = "prompt"  # the row's prompt: a string, or a list of chat messages ({role, content})
    label_key: str = "label"  # the row's label, the reward's ground_truth ("a.b" reaches into a nested object)
    metadata_keys: list[str] = field(default_factory=list)  # row values handed to the reward in extra_info
    reward_fn: str | None = None  # 'pkg.module:function' or 'path/to/file.py:function' (verl's signature)
    reward_batched: bool = False  # true: fn(solution_strs, ground_truths, extra_infos) -> list, once per step
    tokenizer: str | None = None  # HF name or dir (the model's), `qwen3` (shipped), or `arith` (the CPU job's)
    use_chat_template: bool = True  # format the prompt with the tokenizer's chat template when it has one
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. enable_thinking
    prompt_template: str = "{prompt}"  # a string prompt's text before any chat template ({prompt} is replaced)
    on_bad_row: str = "error"  # a row without prompt or label: error (stop, naming file:line) | skip (drop, count)
    max_row_bytes: int = MAX_ROW_BYTES  # a longer row is a bad row, refused unparsed (tasks/base.py)

    def errors(self) -> list[str]:
        errors = choice_errors("on_bad_row", self.on_bad_row, ON_BAD_ROW)
        if not self.path:
            errors.append(f"task.path is required for task=custom: the data file ({', '.join(FORMATS)})")
        elif not str(self.path).endswith(FORMATS):
            errors.append(f"task.path={self.path}: the file must end in one of {', '.join(FORMATS)}")
        if not self.reward_fn:
            errors.append(f"task.reward_fn is required for task=custom: {reward_fn.FORM} (verl's signature "
                          "fn(solution_str, ground_truth, extra_info) -> float)")
        if not self.tokenizer:
            errors.append("task.tokenizer is required for task=custom: the model's Hugging Face name or dir (usually "
                          f"model.path), `qwen3` (shipped), or `{ARITH_TOKENIZER}` (the default CPU job's characters)")
        if "{prompt}" not in self.prompt_template:
            errors.append(f"task.prompt_template={self.prompt_template!r} must contain {{prompt}}")
        return errors


_MISSING = object()


def _get(row: dict, dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


class CustomTask(Task):
    name = "custom"

    def __init__(self, cfg: CustomConfig | None = None, tokenizer: Any = None):
        self.cfg = cfg = cfg or CustomConfig()
        # First: a wrong reward function is refused before the data is read (it is the likelier mistake, and cheap).
        self.reward_function = reward_fn.load(cfg.reward_fn, cfg.reward_batched)
        self._char = tokenizer is None and cfg.tokenizer == ARITH_TOKENIZER
        if tokenizer is None:
            tokenizer = arith.build_tokenizer() if self._char else sources.load_hf_tokenizer(cfg.tokenizer)
        self._tok = tokenizer
        self.skipped = 0  # rows dropped under on_bad_row=skip
        self.skipped_rows: list[str] = []  # "file:line: why" of the first ones, reported at start
        # per row: (where, prompt, label, extra_info, data_source)
        self.rows: list[tuple[str, Any, Any, dict, str]] = []
        for where, row in read_rows(cfg.path, cfg.max_row_bytes):
            self._add(where, row)

    def _bad(self, where: str, why: str) -> None:
        if self.cfg.on_bad_row == "error":
            raise ValueError(f"{where}: {why} (set task.on_bad_row=skip to drop such rows)")
        self.skipped += 1
        if len(self.skipped_rows) < 20:
            self.skipped_rows.append(f"{where}: {why}")

    def _add(self, where: str, row: Any) -> None:
        if isinstance(row, Exception):
            return self._bad(where, str(row))
        if not isinstance(row, dict):
            return self._bad(where, "row is not an object")
        prompt, label = _get(row, self.cfg.prompt_key), _get(row, self.cfg.label_key)
        keys = ", ".join(sorted(row)) or "none"
        if prompt is _MISSING or label is _MISSING:
            missing = " and ".join(f"task.{k}={getattr(self.cfg, k)!r}" for k, v in
                                   (("prompt_key", prompt), ("label_key", label)) if v is _MISSING)
            return self._bad(where, f"no {missing} in the row (its keys: {keys})")
        messages = isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("content"), str) for m in prompt)
        if not messages and not (isinstance(prompt, str) and prompt.strip()):
            return self._bad(where, f"task.prompt_key={self.cfg.prompt_key!r} is {type(prompt).__name__} "
                                    f"{str(prompt)[:40]!r}: need a non-empty string or a list of chat messages")
        extra = {k: (None if (v := _get(row, k)) is _MISSING else v) for k in self.cfg.metadata_keys}
        source = row.get("data_source") if isinstance(row.get("data_source"), str) else Path(self.cfg.path).stem
        self.rows.append((where, prompt, label, extra, source))

    def __len__(self) -> int:
        return len(self.rows)

    def format_prompt(self, prompt: Any) -> tuple[str, list[int]]:
        tok = self._tok
        if isinstance(prompt, str):
            messages = [{"role": "user", "content": self.cfg.prompt_template.replace("{prompt}", prompt)}]
        else:
            messages = [{"role": m.get("role", "user"), "content": m["content"]} for m in prompt]
        if not self._char and self.cfg.use_chat_template and getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                           **self.cfg.chat_template_kwargs)
            return text, tok(text, add_special_tokens=False)["input_ids"]  # the template wrote the specials
        text = "\n\n".join(m["content"] for m in messages)
        if self._char:  # the arith task's form: <bos> then one id per character
            return text, [tok.token_to_id("<bos>")] + tok.encode(text, add_special_tokens=False).ids
        return text, tok(text)["input_ids"]

    def item(self, uid: int) -> PromptItem:
        _, prompt, label, _, _ = self.rows[uid]
        text, ids = self.format_prompt(prompt)
        return PromptItem(uid, text, list(ids), label if isinstance(label, str) else str(label))

    # --- tokenizer: the character tokenizer (tokenizers.Tokenizer) or a Hugging Face one ------------------------
    @property
    def tokenizer(self) -> Any:
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size() if self._char else len(self._tok)

    @property
    def eos_token_id(self) -> int:
        return self._tok.token_to_id("<eos>") if self._char else self._tok.eos_token_id

    @property
    def pad_token_id(self) -> int:
        if self._char:
            return self._tok.token_to_id("<pad>")
        return self._tok.eos_token_id if self._tok.pad_token_id is None else self._tok.pad_token_id

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def save_tokenizer(self, directory: str) -> None:
        if self._char:
            arith.save_tokenizer(self._tok, directory)
        else:
            self._tok.save_pretrained(directory)

    # --- reward: the user's function ---------------------------------------------------------------------------
    def rewards(self, items: list[PromptItem], response_texts: list[str]) -> list[float]:
        rows = [self.rows[it.uid] for it in items]
        return reward_fn.call(self.reward_function, self.cfg.reward_fn, self.cfg.reward_batched, list(response_texts),
                              [r[2] for r in rows], [dict(r[3]) for r in rows], [r[4] for r in rows],
                              [r[0] for r in rows])

    def reward(self, item: PromptItem, response_text: str) -> float:
        return self.rewards([item], [response_text])[0]
