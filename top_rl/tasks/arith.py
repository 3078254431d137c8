"""Generated arithmetic ("3+4=" -> "7"): learnable from scratch by a tiny model on CPU.

The tokenizer is character level (``tokenizers`` WordLevel over single characters), 18 ids:
<pad> <bos> <eos> <unk>, digits, + - * =. The vocabulary is the same for every difficulty setting
so a checkpoint's embedding size never depends on the task knobs.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from top_rl.tasks.base import PromptItem, Task, TaskConfig, choice_errors

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = list("0123456789") + ["+", "-", "*", "="]
VOCAB = SPECIALS + CHARS
VOCAB_SIZE = len(VOCAB)  # 18: for the model config (tasks/arith.VOCAB_SIZE or task.vocab_size)


REWARD_MODES = ("exact", "leading_number")


@dataclass
class ArithConfig(TaskConfig):
    name: str = "arith"
    ops: str = "+"  # any of "+-*"; "-" draws a >= b so answers stay non-negative
    min_operand: int = 0  # smallest operand
    max_operand: int = 4  # the difficulty knob: 0..4 keeps every answer a single digit under "+"
    num_prompts: int = 4096  # dataset size; items are a pure function of (data_seed, uid)
    data_seed: int = 0  # seed of the items' operands
    # "exact": response before <eos> must equal the answer. "leading_number": the number the
    # response starts with must equal it (trailing tokens ignored) - a denser signal for a model
    # that has not yet learnt to stop.
    reward_mode: str = "exact"

    def errors(self) -> list[str]:
        errors = [] if self.ops and not set(self.ops) - set("+-*") else \
            [f"task.ops={self.ops!r} must be a non-empty subset of '+-*'"]
        if not 0 <= self.min_operand <= self.max_operand:
            errors.append(f"task.min_operand={self.min_operand}, task.max_operand={self.max_operand}: need 0 <= "
                          "min_operand <= max_operand")
        return errors + choice_errors("reward_mode", self.reward_mode, REWARD_MODES)


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one char = one token
    tok.decoder = decoders.Fuse()  # join characters without the default space separator
    tok.add_special_tokens(SPECIALS)
    return tok


def save_tokenizer(tok: Tokenizer, directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    tok.save(os.path.join(directory, "tokenizer.json"))
    # Lets transformers.AutoTokenizer load the directory as a PreTrainedTokenizerFast.
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
           "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": 1 << 16}
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)


class ArithTask(Task):
    name = "arith"

    def __init__(self, cfg: ArithConfig | None = None, tokenizer_dir: str | None = None):
        self.cfg = cfg = cfg or ArithConfig()
        self._tok = (Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
                     if tokenizer_dir else build_tokenizer())
        self._bos, self._eos = self._tok.token_to_id("<bos>"), self._tok.token_to_id("<eos>")

    def __len__(self) -> int:
        return self.cfg.num_prompts

    def problem(self, uid: int) -> tuple[int, str, int]:
        if not 0 <= uid < len(self):
            raise IndexError(f"uid {uid} outside [0, {len(self)})")
        rng = random.Random(f"arith:{self.cfg.data_seed}:{uid}")  # per-item stream: O(1) access
        lo, hi = self.cfg.min_operand, self.cfg.max_operand
        a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice(self.cfg.ops)
        if op == "-" and b > a:
            a, b = b, a
        return a, op, b

    def item(self, uid: int) -> PromptItem:
        a, op, b = self.problem(uid)
        ans = {"+": a + b, "-": a - b, "*": a * b}[op]
        prompt = f"{a}{op}{b}="
        return PromptItem(uid, prompt, [self._bos] + self.encode(prompt), str(ans))

    # tokenizer
    @property
    def tokenizer(self) -> Tokenizer:
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    @property
    def eos_token_id(self) -> int:
        return self._eos

    @property
    def pad_token_id(self) -> int:
        return self._tok.token_to_id("<pad>")

    @property
    def bos_token_id(self) -> int:
        return self._bos

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def save_tokenizer(self, directory: str) -> None:
        save_tokenizer(self._tok, directory)

    # reward
    def reward(self, item: PromptItem, response_text: str) -> float:
        text = response_text.split("<eos>", 1)[0]  # accept raw decodes that kept the special
        if self.cfg.reward_mode == "exact":
            return 1.0 if text == item.answer else 0.0
        m = re.match(r"-?\d+", text)
        return 1.0 if m is not None and m.group(0) == item.answer else 0.0
