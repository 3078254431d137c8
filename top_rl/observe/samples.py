"""A step's generations on disk: `run_dir/samples/step_NNNNNN.jsonl.gz`, one JSON row per sample (its prompt and
response text, reward, advantage, length, finish reason, the sum of the log-probs the engine reported for it, its
prompt group and the weight version that generated it), every `rollout.save_samples_every` steps, at most
`rollout.save_samples_rows` rows (the first groups of the step: whole groups, so a group's rewards read together).

Resume writes no sample twice and loses none: a step's file is written whole and atomically before the step's metrics
row, and named by its step, so the resumed run's repeat of a step the checkpoint does not hold replaces that step's file
with the same bytes (a rollout is a pure function of prompts, seeds and weights; gzip's header carries no time here);
files past the checkpoint's step are removed at resume, so a resume that changes `steps` leaves none behind."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from top_rl.atomic import write_file

DIR = "samples"


def path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / DIR / f"step_{step:06d}.jsonl.gz"


def due(every: int, step: int) -> bool:
    return every > 0 and step % every == 0


def rows(step: int, items, samples, texts: list[str], response_texts: list[str], rewards, advantages,
         n_samples: int, max_rows: int) -> list[dict]:
    keep = len(samples) if max_rows <= 0 else min(len(samples), max(max_rows // n_samples, 1) * n_samples)
    out = []
    for i in range(keep):
        s = samples[i]
        out.append({"step": step, "sample": i, "group": i // n_samples, "uid": items[i].uid, "prompt": texts[i],
                    "response": response_texts[i], "reward": float(rewards[i]), "advantage": float(advantages[i]),
                    "length": len(s.response_ids), "finish_reason": s.finish_reason,
                    "logprob_sum": float(sum(s.logprobs)), "policy_version": s.weight_version})
    return out


def save_if_due(run_dir: Path, rollout_cfg, step: int, batch, task) -> list[dict]:
    """Step `step`'s rows, written when rollout.save_samples_every makes it due (else none): `batch` the step's
    samples with their prompt items, rewards and advantages (top_rl.driver.step_batch), `task` its tokenizer's text."""
    if not due(rollout_cfg.save_samples_every, step):
        return []
    sample_rows = rows(step, batch.items, batch.samples, [it.prompt for it in batch.items],
                       [task.response_text(s.response_ids) for s in batch.samples], batch.rewards, batch.advantages,
                       rollout_cfg.n_samples, rollout_cfg.save_samples_rows)
    write(run_dir, step, sample_rows)
    return sample_rows


def write(run_dir: Path, step: int, sample_rows: list[dict]) -> Path:
    target = path(run_dir, step)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in sample_rows).encode("utf-8")

    def save(tmp):
        with open(tmp, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
            gz.write(data)  # mtime=0, no name: the bytes depend on the rows alone (a resumed step writes the same)

    write_file(target, save)
    return target


def drop_after(run_dir: Path, step: int) -> None:
    """At resume from the step-`step` checkpoint: remove the files of later steps (the run generates them again)."""
    for f in (Path(run_dir) / DIR).glob("step_*.jsonl.gz"):
        if int(f.name[5:11]) > step:
            f.unlink()


def read(file: Path) -> list[dict]:
    with gzip.open(file, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]
