"""Input a run can take: the task (its data's bad rows reported with file and line), the start-up check
that the task's tokenizer fits the model, and each step's prompts under `rollout.on_long_prompt`.

A prompt is too long when it leaves no room for `rollout.max_new_tokens` within the model's context
(`max_position_embeddings`, which the engines enforce). Policies:
  error     stop the run, naming the prompt (the default: silent data changes are worse than a stop)
  truncate  keep the prompt's last tokens (the question's end and the generation prompt live there)
  skip      drop it and draw the next prompt from the stream, so every step keeps its batch size
Both counts go to metrics (`rollout/prompts_truncated`, `rollout/prompts_skipped`). The stream
position advances past skipped prompts, so a resumed run skips exactly the same ones.
"""

from __future__ import annotations

import dataclasses

from top_rl.tasks import get_task
from top_rl.tasks.base import DataPosition, PromptItem, Task


class BadInput(ValueError):
    """Input the run refuses, with a message that says what and where."""


class PromptTooLong(BadInput):
    pass


class TokenizerMismatch(BadInput):
    pass


class RewardFailed(BadInput):
    """The task's reward failed on a row (a user's reward function raised, or returned no number): the run stops in
    one line naming the row, as a bad row at start does."""


def rewards(task: Task, items: list[PromptItem], response_ids: list[list[int]]) -> list[float]:
    """The step's rewards: each response's text (up to its eos) scored against its prompt's item."""
    from top_rl.tasks.reward_fn import RewardFnError

    try:
        return task.rewards(items, [task.response_text(ids) for ids in response_ids])
    except RewardFnError as e:
        raise RewardFailed(str(e)) from None


def load_task(task_cfg) -> Task:
    """The run's task; a bad config or data row (`task.on_bad_row=error`) becomes a `BadInput` naming it,
    and rows dropped under `task.on_bad_row=skip` are reported here (their count goes to metrics)."""
    name = task_cfg.name  # a top_rl.tasks.TaskConfig
    try:
        task = get_task(name, task_cfg)
    except OSError as e:
        if e.filename is None:  # a read that failed (/proc/self/mem: EIO) names no file: name the data read
            where = getattr(task_cfg, "path", None) or "its data"
            raise BadInput(f"task {name!r}: reading task.path={where} failed ({e.strerror or e}): point task.path at "
                           "a readable data file") from e
        raise BadInput(f"task {name!r}: {e}") from e
    except (ValueError, KeyError) as e:
        raise BadInput(f"task {name!r}: {e}") from e
    skipped = getattr(task, "skipped", 0)
    if skipped:
        shown = getattr(task, "skipped_rows", [])
        print(f"[top-rl] task {name!r}: skipped {skipped} bad rows (task.on_bad_row=skip)"
              + "".join(f"\n  {r}" for r in shown) + ("\n  ..." if len(shown) < skipped else ""), flush=True)
    return task


def check_tokenizer(task: Task, model_cfg) -> None:
    """Refuse a tokenizer that can emit ids the model has no embedding for."""
    vocab, eos = task.vocab_size, task.eos_token_id
    where = f"the task {task.name!r} tokenizer"
    if vocab > model_cfg.vocab_size:
        raise TokenizerMismatch(
            f"{where} has {vocab} tokens but the model's vocab_size is {model_cfg.vocab_size}: ids >= "
            f"{model_cfg.vocab_size} have no embedding. Use the model's own tokenizer (task.tokenizer=<model dir>) "
            "or a model made for this tokenizer.")
    if eos is None or not 0 <= eos < model_cfg.vocab_size:
        raise TokenizerMismatch(f"{where} has eos_token_id={eos}, outside the model's vocabulary "
                                f"[0, {model_cfg.vocab_size}): generation could never stop on it.")


def _too_long(item: PromptItem, task: Task, max_prompt_len: int) -> PromptTooLong:
    return PromptTooLong(
        f"prompt {item.uid} of task {task.name!r} has {len(item.prompt_ids)} tokens; the model's context "
        f"leaves {max_prompt_len} for a prompt (max_position_embeddings minus rollout.max_new_tokens). "
        "Set rollout.on_long_prompt=truncate or skip, or shorten the prompts.")


def _no_room(max_prompt_len: int) -> PromptTooLong:
    return PromptTooLong(f"no room for any prompt: rollout.max_new_tokens leaves {max_prompt_len} tokens of "
                         "the model's context (max_position_embeddings)")


def check_lengths(task: Task, max_prompt_len: int, on_long: str) -> int:
    """At start (top_rl.preflight), over the whole dataset: under `error` the first prompt too long is refused
    now, not hours into the run; under `skip` at least one prompt must fit. One pass of the task's tokenizer.
    Returns the longest prompt a rollout can see: the dataset's longest under `error` (the pass read them all),
    else max_prompt_len (what sizes the servers' KV pool: top_rl/driver/memory_choice.py)."""
    if max_prompt_len < 1:
        raise _no_room(max_prompt_len)
    if on_long == "truncate":
        return max_prompt_len
    fits, longest = False, 0
    for uid in range(len(task)):
        item = task.item(uid)
        if len(item.prompt_ids) <= max_prompt_len:
            fits, longest = True, max(longest, len(item.prompt_ids))
            if on_long == "skip":
                return max_prompt_len
        elif on_long == "error":
            raise _too_long(item, task, max_prompt_len)
    if not fits:
        raise PromptTooLong(f"every prompt of task {task.name!r} is longer than {max_prompt_len} tokens: "
                            "nothing left to train on after rollout.on_long_prompt=skip")
    return longest


def next_prompts(task: Task, n: int, seed: int, position: DataPosition, max_prompt_len: int,
                 on_long: str) -> tuple[list[PromptItem], DataPosition, dict[str, int]]:
    """The next `n` prompts from `position` that fit in `max_prompt_len` tokens (see module doc), the
    position after them, and the step's counts of truncated and skipped prompts."""
    if max_prompt_len < 1:
        raise _no_room(max_prompt_len)
    items, truncated, skipped, skipped_in_a_row = [], 0, 0, 0
    stream = task.iterate(seed, position)
    while len(items) < n:
        position, item = next(stream)
        if len(item.prompt_ids) <= max_prompt_len:
            items.append(item)
            skipped_in_a_row = 0
        elif on_long == "truncate":
            items.append(dataclasses.replace(item, prompt_ids=list(item.prompt_ids[-max_prompt_len:])))
            truncated += 1
        elif on_long == "skip":
            skipped += 1
            skipped_in_a_row += 1
            if skipped_in_a_row >= len(task):
                raise PromptTooLong(f"every prompt of task {task.name!r} is longer than {max_prompt_len} tokens: "
                                    "nothing left to train on after rollout.on_long_prompt=skip")
        else:
            raise _too_long(item, task, max_prompt_len)
    return items, position, {"rollout/prompts_truncated": truncated, "rollout/prompts_skipped": skipped}
