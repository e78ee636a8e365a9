"""The modelled wall-clock of the sharded replica rules (petra_core/plan/replica_clock.py): the rounds
it charges per step are the ones a run counts, and its overlap rules against their closed forms."""

import json

import pytest
from conftest import argv, tiny_run

from petra_core.plan.cluster import Link, PlanError
from petra_core.plan.replica_clock import TIMINGS, ring_seconds, step_seconds, timing

LINK = Link("ethernet", latency_s=1e-4, bandwidth=1e7)  # 10 MB/s


@pytest.mark.parametrize("rule", sorted(TIMINGS))
def test_the_rounds_charged_are_the_floats_a_run_counts(rule, tmp_path):
    """``floats_sent_per_step`` of a 3-replica run is the model's count of its collectives (an
    all-gather's shard is padded to a multiple of R: within R floats per stage)."""
    from petra_core.cli import main

    R = 3
    config = tiny_run(
        synthetic_train=96, synthetic_test=32, batch_size=8, k=2, epochs=1, replicas=R,
        replica_rule=rule, method="backprop", optimizer="adamw", base_lr=0.01, bn_reestimate_batches=0,
    )  # fmt: skip
    assert main(["train", *argv(config), "--run-dir", str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    counted, params = metrics["floats_sent_per_step"], metrics["params"]
    expected = timing(rule).floats_counted(params, R)
    assert expected <= counted <= expected + timing(rule).all_gathers * metrics["stages"] * R, (counted, expected)


def test_a_ring_moves_each_shard_r_minus_1_times():
    assert ring_seconds(3_000_000, 4, LINK) == pytest.approx(3 * (1e-4 + 4 * 750_000 / 1e7))
    assert ring_seconds(3_000_000, 1, LINK) == 0.0


@pytest.mark.parametrize("compute", [0.01, 10.0])  # the link sets the pace; the compute does
def test_each_rule_overlaps_as_its_schedule_says(compute):
    P, R = 1_000_000, 4
    ring = ring_seconds(P, R, LINK)
    step = {rule: step_seconds(rule, compute_s=compute, params=P, replicas=R, link=LINK) for rule in TIMINGS}
    assert step["zero1"] == pytest.approx(compute + 2 * ring)
    assert step["dpu"] == pytest.approx(max(compute, 2 * ring))
    assert step["acco"] == pytest.approx(2 * max(compute / 2, 2 * ring))
    assert step["wp"] == pytest.approx(max(compute, 3 * ring))
    assert step["dpu"] < step["zero1"]  # one round, hidden behind the next step
    if compute > 4 * ring:  # enough compute to hide ACCO's two rounds
        assert step["acco"] == pytest.approx(compute) and compute < step["zero1"]
    else:  # the link sets the pace: ACCO sends twice DDP's floats
        assert step["acco"] == pytest.approx(4 * ring) and 4 * ring > step["zero1"]


def test_a_rule_without_a_model_is_one_line():
    with pytest.raises(PlanError, match="no wall-clock model for replica rule 'cdp1'; allowed: zero1, dpu, acco, wp"):
        step_seconds("cdp1", compute_s=1.0, params=10, replicas=2, link=LINK)
    with pytest.raises(PlanError, match="compute_s is -1"):
        step_seconds("dpu", compute_s=-1, params=10, replicas=2, link=LINK)
