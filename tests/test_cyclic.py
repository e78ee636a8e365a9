"""Cyclic execution (petra_core/accounting/cyclic.py, the runner's replica offset, report/cyclic.py).

* replicas offset by 0 ticks are the lockstep pipeline, bit for bit;
* DP cannot run offset (its mean is needed before every replica has given its part): one line;
  CDP2 with its stage groups can, spread evenly over a step;
* the same work is done in every schedule (equal mean activation bytes per slot; every copy sends
  its gradient once a step); an even offset lowers the activation peak and spreads the gradient
  traffic over every slot of a step;
* devices from the schedule: DP needs N·J; an assignment computed from the schedule never puts two
  cells of a real run on one device;
* the report renders the measurement (and says when there is none).
"""

import pytest
import torch
from conftest import make_batches, make_model

from petra_core import Simulator
from petra_core.accounting.cyclic import (
    check_assignment,
    cyclic_profile,
    devices_needed,
    measure,
    steady_window,
    summarize,
    uniform_offset,
)
from petra_core.methods.schedule import Schedule
from petra_core.replicas import get_rule

R = 4


def profile(rule, offset, stages=4):
    data = make_batches(R * 3, batch=4)
    rule = get_rule(rule, stages=None if rule == "dp" else stages)
    return cyclic_profile(make_model(), "backprop", rule, replicas=R, offset=offset, batches=data, batch_size=4)


def test_offset_0_is_the_lockstep_pipeline():
    data = make_batches(8, batch=4)
    a = Simulator(
        make_model(),
        "backprop",
        num_batches=2,
        get_batch=data.__getitem__,
        batch_size=4,
        replicas=4,
        rule=get_rule("cdp2", stages=4),
    ).run()
    b = Simulator(
        make_model(),
        "backprop",
        num_batches=2,
        get_batch=data.__getitem__,
        batch_size=4,
        replicas=4,
        rule=get_rule("cdp2", stages=4),
        offset=0,
    ).run()
    for ra, rb in zip(a.replicas, b.replicas):
        assert all(torch.equal(v, rb.model.state_dict()[k]) for k, v in ra.model.state_dict().items())


def test_dp_cannot_run_offset_but_cdp2_can():
    schedule = Schedule("sequential", 10, 3)
    with pytest.raises(RuntimeError, match="the mean gradient of step 0 is needed before every replica has given"):
        profile("dp", uniform_offset(schedule, R))
    frame, _ = profile("cdp2", uniform_offset(schedule, R))
    assert len(frame) == schedule.num_ticks + 3 * uniform_offset(schedule, R)


def test_an_even_offset_flattens_memory_and_spreads_gradient_traffic():
    schedule = Schedule("sequential", 10, 3)
    u = uniform_offset(schedule, R)
    dp, _ = profile("dp", 0)
    cdp, _ = profile("cdp2", u)
    s_dp, s_cdp = summarize(dp, steady_window(schedule, R, 0)), summarize(cdp, steady_window(schedule, R, u))
    assert s_dp["activation_mean"] == pytest.approx(s_cdp["activation_mean"])  # the same work, moved in time
    assert s_dp["grad_mean"] == pytest.approx(s_cdp["grad_mean"])
    assert s_cdp["activation_peak"] < 0.9 * s_dp["activation_peak"]
    assert s_dp["grad_slots_busy"] == 10 and s_cdp["grad_slots_busy"] == schedule.period  # every slot sends
    assert s_cdp["grad_peak"] < s_dp["grad_peak"] / 3
    params = sum(p.numel() * 4 for p in make_model().parameters())
    assert dp.grad_bytes.sum() == cdp.grad_bytes.sum() == params * R * 3  # each copy sends once a step


@pytest.mark.parametrize("offset", [0, 1, 4])
def test_devices_from_the_schedule_hold_in_the_run(offset):
    schedule = Schedule("sequential", 10, 3)
    need = devices_needed(schedule, R, offset)
    if offset == 0:
        assert need["total"] == need["dp_total"] == R * 10 and need["per_stage"] == [R] * 10
    else:
        assert need["total"] < need["dp_total"]
    _, cells = profile("cdp2" if offset else "dp", offset)
    assert check_assignment(cells, need["assignment"]) == []
    crowded = {a: (r, j) for (r, j), a in need["assignment"].items()}
    assert check_assignment(cells, {cell: 0 for cell in need["assignment"]}) != [] and len(crowded) == need["total"]


def test_the_report_renders_the_measurement(tmp_path):
    from petra_core.accounting.cyclic import write
    from petra_core.report import cyclic as report
    from petra_core.report.tables import render

    measured = measure({"archs": ["revnet18"], "width": 4, "batch": 2, "image_size": 16, "steps": 3})
    write(measured, tmp_path)
    loaded = report.load(tmp_path)
    context = report.cyclic_context(loaded)
    assert [r["variant"] for r in context["rows"]] == ["DP", "CDP2, offset 1", "CDP2, offset 4"]
    assert context["rows"][0]["devices"] == 40 and context["rows"][0]["activation_vs_dp"] == 1.0
    md = render("cyclic", "md", context)
    assert "| RevNet18 | DP |" in md and "40 (40)" in md
    assert "Not measured" in render("cyclic", "md", report.cyclic_context(report.load(tmp_path / "none")))
    fig = report.cyclic_figure(loaded)
    assert len(fig.axes) == 2
