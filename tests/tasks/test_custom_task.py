"""task=custom (top_rl/tasks/custom.py, reward_fn.py): a user's data file and reward function from the config, every
mistake in one message naming the key and the fix; the entry-point group for other packages' Task classes."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from top_rl.tasks import get_task, task_config
from top_rl.tasks.custom import CustomConfig
from top_rl.tasks.prompts import BadInput, RewardFailed, load_task, rewards

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path, rows, reward="def score(solution_str, ground_truth, extra_info):\n"
                                  "    return float(solution_str == ground_truth) + extra_info.get('bonus', 0)\n"):
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rew.py").write_text(reward)
    return tmp_path


ROWS = [{"q": "1+1=", "a": "2", "bonus": 0.5}, {"q": "2+2=", "a": "4", "bonus": 0}]


def _task(tmp_path, **kw):
    cfg = CustomConfig(path=str(tmp_path / "data.jsonl"), prompt_key="q", label_key="a", tokenizer="arith",
                       reward_fn=f"{tmp_path / 'rew.py'}:score", **kw)
    return load_task(cfg)


def test_rows_prompts_and_a_reward_file_outside_the_package(tmp_path):
    task = _task(_write(tmp_path, ROWS), metadata_keys=["bonus"])
    assert len(task) == 2 and task.vocab_size == 18
    it = task.item(0)
    assert it.prompt == "1+1=" and it.prompt_ids[0] == task.tokenizer.token_to_id("<bos>")
    assert task.decode(it.prompt_ids) == "1+1="  # <bos>, then one id per character: the arith task's form
    eos = task.eos_token_id
    two = task.tokenizer.encode("2", add_special_tokens=False).ids
    # the response up to eos is the solution_str; extra_info carries the metadata keys
    assert rewards(task, [it, it, task.item(1)], [two + [eos, 5], [5], two]) == [1.5, 0.5, 0.0]


def test_batched_and_verl_data_source_signatures(tmp_path):
    batched = ("def score(solution_strs, ground_truths, extra_infos):\n"
               "    return [len(s) for s in solution_strs]\n")
    task = _task(_write(tmp_path, ROWS, batched), reward_batched=True)
    assert task.rewards([task.item(0), task.item(1)], ["ab", "abc"]) == [2.0, 3.0]
    verl = ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
            "    return {'score': float(data_source == 'data'), 'acc': 1}\n")
    (tmp_path / "rew.py").write_text(verl)
    cfg = CustomConfig(path=str(tmp_path / "data.jsonl"), prompt_key="q", label_key="a", tokenizer="arith",
                       reward_fn=f"{tmp_path / 'rew.py'}:compute_score")
    task = load_task(cfg)
    assert task.reward(task.item(0), "x") == 1.0  # data_source: the file's stem, verl's dict result


def test_a_module_reward_and_nested_label_key(tmp_path, monkeypatch):
    rows = [{"prompt": [{"role": "user", "content": "3+4="}], "reward_model": {"ground_truth": 7}}]
    _write(tmp_path, rows, "")
    (tmp_path / "my_rewards_pkg").mkdir()
    (tmp_path / "my_rewards_pkg" / "__init__.py").write_text("def exact(s, g, x):\n    return float(s == str(g))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = load_task(CustomConfig(path=str(tmp_path / "data.jsonl"), label_key="reward_model.ground_truth",
                                  tokenizer="arith", reward_fn="my_rewards_pkg:exact"))
    assert task.item(0).prompt == "3+4=" and task.item(0).answer == "7"
    assert task.reward(task.item(0), "7") == 1.0  # ground_truth as stored (the int 7), not its string


@pytest.mark.parametrize("reward_fn,body,message", [
    ("nowhere.py:score", None, r"task.reward_fn=nowhere.py:score: no file nowhere.py \(a relative path is read from"),
    ("no_such_pkg_xyz.mod:score", None, r"cannot import 'no_such_pkg_xyz.mod' .*No module named"),
    ("{d}/rew.py:scor", "def score(a, b, c):\n    return 0\n", r"has no 'scor' \(its functions: score\)"),
    ("{d}/rew.py:score", "def score(solution_str):\n    return 0\n",
     r"score\(solution_str\) cannot be called as score\(solution_str, ground_truth, extra_info\)"),
    ("{d}/rew.py:score", "raise RuntimeError('broken import')\n", r"importing .*rew.py raised RuntimeError: broken"),
    ("{d}/rew.py:score", "score = 3\n", r"'score' is a int, not a function"),
    ("score", None, r"task.reward_fn='score' must be 'pkg.module:function' or 'path/to/file.py:function'"),
])
def test_a_wrong_reward_function_is_one_line_before_the_data_is_read(tmp_path, reward_fn, body, message):
    _write(tmp_path, ROWS, body or "")
    cfg = CustomConfig(path=str(tmp_path / "data.jsonl"), prompt_key="q", label_key="a", tokenizer="arith",
                       reward_fn=reward_fn.format(d=tmp_path))
    with pytest.raises(BadInput, match=message) as e:
        load_task(cfg)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("body,message", [
    ("def score(s, g, x):\n    return 1 / 0 if g == '4' else 1.0\n",
     r"raised ZeroDivisionError: division by zero on row .*data.jsonl:2 \(response '123'\)"),
    ("def score(s, g, x):\n    return None if g == '4' else 1.0\n", r"returned None on row .*data.jsonl:2"),
    ("def score(s, g, x):\n    return float('nan')\n", r"returned nan on row .*data.jsonl:1"),
])
def test_a_reward_that_fails_on_a_row_names_the_row(tmp_path, body, message):
    task = _task(_write(tmp_path, ROWS, body))
    with pytest.raises(RewardFailed, match=message):
        rewards(task, [task.item(0), task.item(1)], [[], []] if "nan" in message else
                [task.tokenizer.encode("123", add_special_tokens=False).ids] * 2)


def test_bad_rows_and_config_are_named(tmp_path):
    _write(tmp_path, [{"q": "1+1=", "a": "2"}, {"question": "x", "a": "1"}])
    with pytest.raises(BadInput, match=r"data.jsonl:2: no task.prompt_key='q' in the row \(its keys: a, question\)"):
        _task(tmp_path)
    assert len(_task(tmp_path, on_bad_row="skip")) == 1
    with pytest.raises(ValueError, match="task.path is required.*task.reward_fn is required.*task.tokenizer is required"):
        task_config("custom", {})


def test_parquet_rows(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    _write(tmp_path, [])
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "data.parquet")
    task = get_task("custom", CustomConfig(path=str(tmp_path / "data.parquet"), prompt_key="q", label_key="a",
                                           tokenizer="arith", reward_fn=f"{tmp_path / 'rew.py'}:score"))
    assert [task.item(i).answer for i in range(2)] == ["2", "4"]


def test_a_task_class_from_another_package_through_the_entry_point_group(tmp_path):
    """A distribution on sys.path that registers `mytask` under top_rl.tasks: `task=mytask` composes its dataclass
    (no yaml) and builds its Task."""
    pkg = tmp_path / "site"
    (pkg / "my_tasks").mkdir(parents=True)
    (pkg / "my_tasks" / "__init__.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass
        from top_rl.tasks.arith import ArithConfig, ArithTask

        @dataclass
        class MyConfig(ArithConfig):
            name: str = "mytask"
            shift: int = 0

        class MyTask(ArithTask):
            name = "mytask"
            config_class = MyConfig
        """))
    dist = pkg / "my_tasks-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-tasks\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[top_rl.tasks]\nmytask = my_tasks:MyTask\n")
    code = ("from top_rl.cli import compose; from top_rl.tasks import get_task\n"
            "cfg = compose(['task=mytask', 'task.shift=3'])\n"
            "print(type(cfg.task).__name__, cfg.task.shift, type(get_task('mytask', cfg.task)).__name__)")
    env = {"PYTHONPATH": f"{pkg}:{ROOT}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split() == ["MyConfig", "3", "MyTask"], out.stderr[-2000:]
    (dist / "entry_points.txt").write_text("[top_rl.tasks]\nmytask = my_tasks:MyConfig\n")  # not a Task class
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "entry point 'mytask' = 'my_tasks:MyConfig' (group top_rl.tasks, package my-tasks) must name a " \
           "top_rl.tasks.Task subclass" in out.stderr
