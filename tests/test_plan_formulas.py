"""The closed-form memory per stage set beside the planner's (``petra_core/plan/formulas.py``)."""

import math

import pytest

from petra_core.plan.formulas import memory_terms, paper_terms, pipedream_stash_bytes


def test_pipedreams_charge_is_its_optimizers_stashed_data_size():
    # a stage ending after 3 of 8 machines, replicated twice: ceil(5 / 2) = 3 stashes of A + W
    assert pipedream_stash_bytes(100, 10, machines=8, up_to=3, replicas=2) == 3 * 110
    assert pipedream_stash_bytes(100, 10, machines=8, up_to=8) == 0  # the last stage stashes nothing


def test_the_papers_terms_come_from_the_reference_file():
    t = paper_terms("delayed", J=10, j=1, k=2, input_bytes=4, graph_bytes=12, weight_bytes=8)
    assert (t["activations_expr"], t["params_expr"]) == ("2*(J-j)*FG", "2*(J-j)/k")
    assert t["activations_bytes"] == pytest.approx(18 * 12) and t["params_bytes"] == pytest.approx(9 * 8)
    assert paper_terms("petra", J=10, j=1, k=1, input_bytes=4, graph_bytes=12, weight_bytes=8)["activations_bytes"] == 0


@pytest.fixture(scope="module")
def terms():
    return memory_terms("revnet18", width=4, stem="cifar", batch=2, num_classes=10, image_size=16)


def test_delayed_per_stage_pipedream_is_half_the_papers_in_flight(terms):
    """One device per stage: PipeDream charges J - j stashes, the paper (and petra's schedule) 2(J - j)."""
    delayed = [t for t in terms if t["method"] == "delayed"]
    J = len(delayed)
    for t in delayed:
        j = t["stage"]
        assert t["pipedream_bytes"] == (J - j) * (t["kept_bytes"] + t["weight_bytes"])
        assert t["stash_copies"] == 2 * (J - j)  # the schedule's staleness: the paper's 2(J - j) at k = 1
        assert t["activations_bytes"] == pytest.approx(2 * (J - j) * t["graph_bytes"])
        assert t["planner_bytes"] >= t["activations_bytes"] + t["weight_bytes"]  # it holds at least these
    assert all(t["pipedream_bytes"] is None for t in terms if t["method"] != "delayed")
    assert {t["method"] for t in terms} == {"backprop", "delayed", "dsp", "petra"}
    assert not any(math.isnan(t["planner_bytes"]) for t in terms)
