"""The Task interface: a deterministic, resumable stream of prompts, a tokenizer and a reward."""

from __future__ import annotations

import abc
import gzip
import os
import random
import stat
from dataclasses import dataclass
from typing import Any, Iterator

from top_rl.config.task import TaskConfig, choice_errors  # noqa: F401 - also base.TaskConfig


ON_BAD_ROW = ("error", "skip")  # a malformed row: stop naming file:line | drop and count it


@dataclass
class PromptItem:
    uid: int  # index in the task's dataset: stable across runs, used as the sample id
    prompt: str  # the formatted prompt text (template applied)
    prompt_ids: list[int]  # what the engine is given (bos / chat tokens included)
    answer: str  # gold answer, normalised as the reward compares it


@dataclass
class DataPosition:
    """Where the prompt stream stands: ``index`` items of ``epoch`` are consumed. Checkpointed."""
    epoch: int = 0
    index: int = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    @classmethod
    def from_state_dict(cls, d: dict[str, int]) -> "DataPosition":
        return cls(int(d["epoch"]), int(d["index"]))


class Task(abc.ABC):
    """Subclasses provide the dataset (``__len__``, ``item``), the tokenizer and ``reward``."""

    name: str = "task"

    # --- dataset -------------------------------------------------------------------------------
    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def item(self, uid: int) -> PromptItem: ...

    def order(self, seed: int, epoch: int) -> list[int]:
        # A string seed makes random.Random hash it with sha512: independent of PYTHONHASHSEED
        # and of platform, so the same (seed, epoch) gives the same permutation everywhere.
        perm = list(range(len(self)))
        random.Random(f"top-rl:{seed}:{epoch}").shuffle(perm)
        return perm

    def iterate(self, seed: int, start: DataPosition | None = None
                ) -> Iterator[tuple[DataPosition, PromptItem]]:
        """Endless stream of ``(position after this item, item)``; saving that position and
        restarting from it continues with the next item, so resume neither repeats nor skips."""
        if len(self) == 0:
            raise ValueError(f"task {self.name!r} has no prompts")
        epoch, index = (start.epoch, start.index) if start else (0, 0)
        while True:
            perm = self.order(seed, epoch)
            while index < len(perm):
                uid = perm[index]
                index += 1
                yield DataPosition(epoch, index), self.item(uid)
            epoch, index = epoch + 1, 0

    def batch(self, n: int, seed: int, start: DataPosition | None = None
              ) -> tuple[list[PromptItem], DataPosition]:
        """The next ``n`` prompts from ``start`` and the position to resume from."""
        items, pos = [], start or DataPosition()
        it = self.iterate(seed, pos)
        for _ in range(n):
            pos, item = next(it)
            items.append(item)
        return items, pos

    # --- tokenizer -----------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def tokenizer(self) -> Any: ...

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def eos_token_id(self) -> int: ...

    @property
    @abc.abstractmethod
    def pad_token_id(self) -> int: ...

    @abc.abstractmethod
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Token ids -> text."""

    def response_text(self, response_ids: list[int]) -> str:
        """The text the reward sees: the response up to (not including) the first eos. Other
        special tokens stay in the text: dropping them would let a policy pad a correct answer
        with <pad>/<bos> and still be rewarded (a hack a from-scratch model finds in a few steps)."""
        ids = list(response_ids)
        if self.eos_token_id in ids:
            ids = ids[: ids.index(self.eos_token_id)]
        return self.decode(ids, skip_special_tokens=False)

    @abc.abstractmethod
    def save_tokenizer(self, directory: str) -> None:
        """Write tokenizer.json (+ tokenizer_config.json) so an HF export can carry it."""

    # --- reward --------------------------------------------------------------------------------
    @abc.abstractmethod
    def reward(self, item: PromptItem, response_text: str) -> float: ...

    def rewards(self, items: list[PromptItem], response_texts: list[str]) -> list[float]:
        """A step's rewards, one per (item, response): what the loop calls. A task whose reward is cheaper in a batch
        (a user's batched reward function: top_rl.tasks.custom) overrides it; the default asks `reward` per sample."""
        return [self.reward(it, text) for it, text in zip(items, response_texts)]


class HFTokenizerTask(Task):
    """A task whose tokenizer is a Hugging Face tokenizer held in `self._tok` (gsm8k, dapo)."""

    _tok: Any

    @property
    def tokenizer(self) -> Any:
        return self._tok

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    @property
    def eos_token_id(self) -> int:
        return self._tok.eos_token_id

    @property
    def pad_token_id(self) -> int:
        pad = self._tok.pad_token_id
        return self._tok.eos_token_id if pad is None else pad

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def save_tokenizer(self, directory: str) -> None:
        self._tok.save_pretrained(directory)


# Default of a file task's `max_row_bytes`: far above any row whose prompt fits a model's context. A longer row is
# refused (or skipped) unread: parsing and tokenizing a 50 MB row took minutes and ~20 GB before being refused.
MAX_ROW_BYTES = 1 << 20
_CHUNK = 1 << 16  # how an over-long line is skipped: bounded reads, never the whole line in memory


def row_too_long(size: int, limit: int) -> ValueError:
    return ValueError(f"row is {size:,} bytes, over task.max_row_bytes={limit:,}: refused unparsed (no model's "
                      "context holds a prompt that long); shorten or split it, or raise task.max_row_bytes")


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def check_regular_file(path: str, key: str = "task.path") -> None:
    """Refuse a data path that is not a regular file, before reading it: /dev/zero has no line end to stop at (the
    read would never return), a FIFO blocks until a writer comes, a directory fails with an OS error. A missing file
    is left to the open that follows (its OSError names it); a symlink counts as what it points to."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        raise ValueError(f"{key}={path} is {_kind(mode)}, not a regular file: nothing was read from it; point {key} "
                         "at a data file")


def text_lines(path: str, max_bytes: int = MAX_ROW_BYTES):
    """(``"path:line"``, text) for each line of a text file, read line by line; a line that is not UTF-8, or longer
    than `max_bytes` (not counting its newline), comes as a ValueError naming why, so a bad row is reported at its
    file:line (decoding the whole file would name only an offset). Memory stays within a few times max_bytes."""
    if max_bytes < 1:
        raise ValueError(f"task.max_row_bytes={max_bytes} must be >= 1")
    check_regular_file(path)
    opener = gzip.open if str(path).endswith(".gz") else open  # the shipped copies are gzipped (tasks/sources.py)
    with opener(path, "rb") as f:
        ln = 0
        while raw := f.readline(max_bytes + 1):
            ln += 1
            where = f"{path}:{ln}"
            if len(raw) > max_bytes and not raw.endswith(b"\n"):  # over-long: skip to its end, counting
                size = len(raw)
                while chunk := f.readline(_CHUNK):
                    if chunk.endswith(b"\n"):
                        size += len(chunk) - 1
                        break
                    size += len(chunk)
                yield where, row_too_long(size, max_bytes)
                continue
            try:
                yield where, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield where, ValueError(f"not UTF-8 text (byte {raw[e.start:e.start + 1]!r} at column {e.start + 1})")
