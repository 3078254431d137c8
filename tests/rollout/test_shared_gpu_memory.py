"""A colocated SGLang server and trainer rank on one GPU (top_rl/rollout/sglang/memory.py, preflight): the parameter
count is Qwen3-0.6B's, and a layout that cannot fit is refused before start with the numbers and the fix."""

from __future__ import annotations

import pytest

from top_rl import preflight
from top_rl.cli import compose
from top_rl.model.qwen3.config import Qwen3Config
from top_rl.driver import memory_choice
from top_rl.driver.local_gpu import LocalGpu
from top_rl.rollout.sglang import memory as sglang_memory

QWEN3_06B = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                        tie_word_embeddings=True)
H200 = 143771 << 20
H200_GPU = LocalGpu("NVIDIA H200", (9, 0), H200)


def test_param_count_is_qwen3_06b():
    assert sglang_memory.param_count(QWEN3_06B) == 596_049_920  # Qwen3-0.6B's safetensors hold 596,049,920 values


def test_estimate_grows_with_what_the_trainer_holds():
    small = sglang_memory.trainer_bytes(QWEN3_06B, 4096, recompute=True)
    assert sglang_memory.trainer_bytes(QWEN3_06B, 16384, recompute=True) > small
    assert sglang_memory.trainer_bytes(QWEN3_06B, 4096, recompute=False) > small
    assert small > 18 * 596_049_920


def _cfg(tmp_path, *overrides):
    return compose([f"run_dir={tmp_path / 'run'}", "+experiment=one_gpu_qwen3_0.6b_sglang", *overrides])


def test_colocated_server_and_trainer_that_do_not_fit_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(memory_choice, "local_gpu", lambda: H200_GPU)
    monkeypatch.setattr(preflight.placement, "check_before_start", lambda *a, **k: None)  # no GPU on this machine
    preflight.check(_cfg(tmp_path))  # the shipped one-GPU job fits an H200
    with pytest.raises(preflight.Refused, match=r"cannot hold both: 1 SGLang server\(s\) x \(136\.\d GiB static.*"
                                                r"set rollout.sglang.mem_fraction_static <= 0\.\d\d"):
        preflight.check(_cfg(tmp_path, "rollout.sglang.mem_fraction_static=0.97"))
    assert not (tmp_path / "run").exists()


def test_no_gpu_visible_means_no_memory_check(tmp_path, monkeypatch):
    monkeypatch.setattr(memory_choice, "local_gpu", lambda: None)
    monkeypatch.setattr(preflight.placement, "check_before_start", lambda *a, **k: None)
    preflight.check(_cfg(tmp_path, "rollout.sglang.mem_fraction_static=0.99"))


def test_a_handed_over_gpu_fits_each_phase_and_counts_the_trainers_resident_memory(tmp_path, monkeypatch):
    """cluster.gpu_handoff=true: the servers' memory need only fit beside what the trainer keeps between steps (64 B a
    parameter, measured), not beside its whole step. The layouts that overflowed on the H200 (the GSM8K job with the
    server at 0.8, and at 0.7 beside the trainer's 35 GiB after step 2: a re-score ran out of memory at step 3) are
    refused before start, naming the fraction that fits; 0.6 runs."""
    monkeypatch.setattr(memory_choice, "local_gpu", lambda: H200_GPU)
    monkeypatch.setattr(preflight.placement, "check_before_start", lambda *a, **k: None)
    est = sglang_memory.estimate(QWEN3_06B, 16384, True, 0.7, 1, H200, handoff=True)
    apart = sglang_memory.estimate(QWEN3_06B, 16384, True, 0.7, 1, H200, handoff=False)
    assert est.needed <= apart.needed and est.trainer_resident_bytes == 64 * 596_049_920
    assert est.needed == max(est.servers_bytes + est.trainer_resident_bytes,
                             sglang_memory.CUDA_CONTEXT_BYTES + est.trainer_bytes) + sglang_memory.CUDA_CONTEXT_BYTES
    job = ["+experiment=gsm8k_qwen3_0.6b", "model.path=null", "rollout.num_engines=1", "cluster.colocate=true",
           "cluster.engine_gpus=0.5", "cluster.trainer_gpus=0.5", "cluster.gpu_handoff=true", "task.tokenizer=qwen3"]
    for fraction, static in (("0.8", r"112\.3"), ("0.7", r"98\.3")):
        with pytest.raises(preflight.Refused, match=rf"rollout: 1 SGLang server\(s\) x \({static} GiB static.*the "
                                                    r"trainer's resident ~35\.5 GiB.*set rollout.sglang."
                                                    r"mem_fraction_static <= 0\.6\d"):
            preflight.check(compose([f"run_dir={tmp_path / 'a'}", *job, f"rollout.sglang.mem_fraction_static={fraction}"]))
    preflight.check(compose([f"run_dir={tmp_path / 'b'}", *job, "rollout.sglang.mem_fraction_static=0.6"]))


QWEN3_4B = Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                       tie_word_embeddings=True)


def test_offload_during_rollout_counts_only_the_weights_between_steps(tmp_path, monkeypatch):
    """trainer.offload_during_rollout: between steps the trainer keeps its weights (4 B a parameter) and one
    micro-batch's fp32 logits (what covers the 18.1 GiB measured allocated at 4B, sglang_memory's doc), so the
    Qwen3-4B shape handed over on one H200 fits at 0.7 with it (as it ran, session 14) and is refused without it,
    the refusal naming its numbers; the step phase is the formula's whole trainer."""
    assert sglang_memory.param_count(QWEN3_4B) == 4_022_468_096  # Qwen3-4B's parameter count
    est = sglang_memory.estimate(QWEN3_4B, 16384, True, 0.7, 1, H200, handoff=True, offload=True)
    assert est.trainer_resident_bytes == 4 * 4_022_468_096 + 4 * 16384 * 151936
    assert est.trainer_resident_bytes >= 18.1 * sglang_memory.GIB  # the measurement it must cover
    assert est.trainer_bytes == sglang_memory.trainer_bytes(QWEN3_4B, 16384, True)
    assert est.needed <= H200 and "offloaded: trainer.offload_during_rollout" in est.describe()
    kept = sglang_memory.estimate(QWEN3_4B, 16384, True, 0.7, 1, H200, handoff=True)
    assert kept.trainer_resident_bytes == 64 * 4_022_468_096 and kept.needed > H200
    # without the handoff nothing is offloaded (config_checks.validate refuses the switch there)
    assert not sglang_memory.estimate(QWEN3_4B, 16384, True, 0.7, 1, H200, offload=True).offload

    monkeypatch.setattr(memory_choice, "local_gpu", lambda: H200_GPU)
    monkeypatch.setattr(preflight.placement, "check_before_start", lambda *a, **k: None)
    job = ["+experiment=gsm8k_qwen3_0.6b", "model=qwen3_4b", "model.path=null", "rollout.num_engines=1",
           "cluster.colocate=true", "cluster.engine_gpus=0.5", "cluster.trainer_gpus=0.5", "cluster.gpu_handoff=true",
           "rollout.sglang.mem_fraction_static=0.7", "model.max_position_embeddings=2048"]
    preflight.check(compose([f"run_dir={tmp_path / 'a'}", *job, "trainer.offload_during_rollout=true"]))
    with pytest.raises(preflight.Refused, match=r"rollout: 1 SGLang server\(s\) x \(98\.3 GiB static.*the trainer's "
                                                r"resident ~239\.\d GiB; step: .* needs \d+\.\d GiB of the GPU's "
                                                r"140\.4 GiB.*the trainer alone leaves no room"):
        preflight.check(compose([f"run_dir={tmp_path / 'b'}", *job]))
    with pytest.raises(preflight.Refused, match=r"the trainer's resident ~24\.2 GiB \(optimizer state and gradients "
                                                r"offloaded: trainer\.offload_during_rollout\).*needs 159\.5 GiB.*"
                                                r"set rollout\.sglang\.mem_fraction_static <= 0\.76 \(or auto\)"):
        preflight.check(compose([f"run_dir={tmp_path / 'c'}", *job, "trainer.offload_during_rollout=true",
                                 "rollout.sglang.mem_fraction_static=0.9"]))


H100_GPU = LocalGpu("NVIDIA H100 80GB HBM3", (9, 0), 81559 << 20)


def _auto(tmp_path, monkeypatch, gpu, experiment, *overrides):
    monkeypatch.setattr(memory_choice, "local_gpu", lambda: gpu)
    monkeypatch.setattr(preflight.placement, "check_before_start", lambda *a, **k: None)
    cfg = compose([f"run_dir={tmp_path / experiment}", f"+experiment={experiment}", "model.path=null",
                   "task.tokenizer=qwen3", *overrides])
    ready = preflight.check(cfg)
    return cfg, ready


def test_auto_sizes_the_one_gpu_gsm8k_job_for_the_card_it_lands_on(tmp_path, monkeypatch, capsys):
    """mem_fraction_static=auto (top_rl/driver/memory_choice.py): on an 80 GB H100 the shipped one-GPU GSM8K recipe,
    whose trainer kept on the GPU leaves the server at most 0.44 (the refusal users met), turns the offload on and
    takes the room that gives less the headroom a server needs beyond the estimate (0.66: the batch of 512 x
    (235 + 1024) tokens needs more; at 0.74, without the headroom, step 3 ran out of memory on an H100); on an H200
    the whole batch fits beside the trainer kept on the GPU (0.53, no offload). The engines' configs carry the
    number, the start-up line says why, and the estimate's check passes it."""
    cfg, ready = _auto(tmp_path, monkeypatch, H100_GPU, "gsm8k_qwen3_0.6b_one_gpu")
    assert cfg.rollout.sglang.mem_fraction_static == 0.66 and cfg.trainer.offload_during_rollout
    assert [s.mem_fraction_static for s in ready.sglang] == [0.66]
    out = capsys.readouterr().out
    assert "mem_fraction_static=auto: NVIDIA H100 80GB HBM3 (sm90), 79.6 GiB: 0.66" in out
    assert "~364 of its 512 requests (the rest queue) at their longest, 1259 tokens" in out
    assert "trainer.offload_during_rollout=true" in out
    # the trainer kept on the GPU: what an explicit value may take at most, the same estimate
    kept = sglang_memory.estimate(ready.model_cfg, 16384, True, 0.5, 1, H100_GPU.total_bytes, handoff=True)
    assert kept.best_fraction() < 0.45
    cfg, _ = _auto(tmp_path, monkeypatch, H200_GPU, "gsm8k_qwen3_0.6b_one_gpu")
    assert cfg.rollout.sglang.mem_fraction_static == 0.53 and not cfg.trainer.offload_during_rollout
    assert "all 512 requests at their longest" in capsys.readouterr().out


def test_auto_sizes_a_small_batch_at_the_floor(tmp_path, monkeypatch):
    """The one-GPU arith job (256 requests of <= 256 tokens) gets the floor (0.3), as it ran with a fixed 0.3."""
    monkeypatch.setattr(memory_choice, "local_gpu", lambda: H100_GPU)
    monkeypatch.setattr(preflight.placement, "check_before_start", lambda *a, **k: None)
    cfg = compose([f"run_dir={tmp_path / 'arith'}", "+experiment=one_gpu_qwen3_0.6b_sglang"])
    preflight.check(cfg)
    assert cfg.rollout.sglang.mem_fraction_static == 0.3 and not cfg.trainer.offload_during_rollout


def test_auto_without_a_gpu_to_size_from(tmp_path, monkeypatch):
    """No GPU visible locally: SGLang's own sizing (nothing SGLang-on-GPU runs there); engines on GPUs of their own:
    the same; a colocated run on a Ray cluster whose driver sees no GPU is refused naming the key."""
    cfg, _ = _auto(tmp_path, monkeypatch, None, "gsm8k_qwen3_0.6b_one_gpu")
    assert cfg.rollout.sglang.mem_fraction_static is None
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    with pytest.raises(preflight.Refused, match=r"mem_fraction_static=auto: the driver sees no GPU .* name the "):
        preflight.check(compose([f"run_dir={tmp_path / 'c'}", "+experiment=gsm8k_qwen3_0.6b_one_gpu",
                                 "model.path=null", "top.attention_backend=triton", "rollout.logprob_source=prefill"]))


def test_a_fraction_outside_0_1_is_refused_by_name(tmp_path):
    from top_rl.config import ConfigError

    for bad in ("1.5", "0", "half"):
        with pytest.raises((ConfigError, preflight.Refused, ValueError), match=r"rollout\.sglang\.mem_fraction_static"):
            preflight.check(compose([f"run_dir={tmp_path / 'x'}", "+experiment=one_gpu_qwen3_0.6b_sglang",
                                     f"rollout.sglang.mem_fraction_static={bad}"]))
