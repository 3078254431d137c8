"""The Task interface: a deterministic, resumable stream of prompts, a tokenizer and a reward."""

from __future__ import annotations

import abc
import gzip
import random
from dataclasses import dataclass
from typing import Any, Iterator


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


def text_lines(path: str):
    """(``"path:line"``, text) for each line of a text file; a line that is not UTF-8 comes as a ValueError naming
    the byte, so a bad row is reported at its file:line (decoding the whole file would name only an offset)."""
    opener = gzip.open if str(path).endswith(".gz") else open  # the shipped copies are gzipped (tasks/sources.py)
    with opener(path, "rb") as f:
        for ln, raw in enumerate(f, 1):
            try:
                yield f"{path}:{ln}", raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield f"{path}:{ln}", ValueError(f"not UTF-8 text (byte {raw[e.start:e.start + 1]!r} at column "
                                                 f"{e.start + 1})")
