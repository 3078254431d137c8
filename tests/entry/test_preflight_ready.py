"""preflight.Ready is built in one place (preflight.check) from the parts the checks return, in CHECKS' order; a check
sees what the checks before it returned and cannot change it (issue 51: Ready was a mutable bag every check wrote)."""

from __future__ import annotations

import dataclasses

import pytest

from top_rl import preflight


def test_ready_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        preflight.Ready().task = "a task"  # what every check did before: no check can write into it now


def test_check_builds_ready_from_each_checks_part_in_order():
    seen = []

    def loads_the_task(cfg, ready):
        seen.append(ready.task)
        return {"task": "the task"}

    def reads_it(cfg, ready):
        seen.append(ready.task)
        return {"max_prompt_len": 7}

    def refuses_nothing(cfg, ready):
        return None

    ready = preflight.check(object(), (loads_the_task, refuses_nothing, reads_it))
    assert seen == [None, "the task"]
    assert ready == dataclasses.replace(preflight.Ready(), task="the task", max_prompt_len=7)


def test_a_part_naming_no_field_of_ready_is_an_error():
    with pytest.raises(TypeError):
        preflight.check(object(), (lambda cfg, ready: {"tsk": 1},))
