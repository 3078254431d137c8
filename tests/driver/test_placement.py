"""Placement plans (top_rl.driver.placement): bundles per layout, colocation, and refusals that name what was asked
and what the cluster has. Pure functions: no Ray."""

import pytest

from top_rl.driver.placement import ClusterConfig, PlacementError, check, plan


def test_separate_layout_gives_each_actor_its_bundle():
    p = plan(2, 4, ClusterConfig(engine_gpus=1, trainer_gpus=1, engine_cpus=2, trainer_cpus=3))
    assert p.bundles == [{"CPU": 2, "GPU": 1}] * 2 + [{"CPU": 3, "GPU": 1}] * 4
    assert p.engine_bundle == [0, 1] and p.trainer_bundle == [2, 3, 4, 5]
    assert (p.engine_gpus, p.trainer_gpus) == (1, 1)
    assert p.total() == {"CPU": 16, "GPU": 6}


def test_cpu_layout_asks_for_no_gpu():
    p = plan(1, 2, ClusterConfig())
    assert all("GPU" not in b for b in p.bundles) and p.total() == {"CPU": 3}


def test_colocated_engines_fill_gpus_from_the_last_rank():
    cfg = ClusterConfig(colocate=True, engine_gpus=0.5, trainer_gpus=0.5, engine_cpus=1, trainer_cpus=2)
    p = plan(1, 2, cfg)
    assert p.bundles == [{"CPU": 2, "GPU": 1.0}, {"CPU": 3, "GPU": 1.0}]
    assert p.engine_bundle == [1] and p.trainer_bundle == [0, 1]  # rank 0's GPU stays engine-free
    p = plan(3, 2, ClusterConfig(colocate=True, engine_gpus=0.25, trainer_gpus=0.5))
    assert p.engine_bundle == [1, 0, 1]


def test_colocation_refuses_whole_gpus_and_overfull_gpus():
    with pytest.raises(PlacementError, match="fractional cluster.trainer_gpus and cluster.engine_gpus"):
        plan(1, 2, ClusterConfig(colocate=True, engine_gpus=1, trainer_gpus=1))
    with pytest.raises(PlacementError, match=r"2 on one GPU: trainer_gpus 0.5 \+ 2 x engine_gpus 0.5 > 1"):
        plan(3, 2, ClusterConfig(colocate=True, engine_gpus=0.5, trainer_gpus=0.5))


def test_check_names_what_was_asked_and_what_there_is():
    p = plan(1, 2, ClusterConfig(engine_gpus=1, trainer_gpus=1))
    with pytest.raises(PlacementError) as e:
        check(p, {"CPU": 32.0, "GPU": 2.0}, "this machine")
    msg = str(e.value)
    assert "1 engine(s) x 1 GPU, 2 trainer rank(s) x 1 GPU" in msg and "3 GPU" in msg
    assert "this machine has 32 CPU, 2 GPU" in msg
    check(p, {"CPU": 3.0, "GPU": 3.0}, "this machine")  # exactly enough
