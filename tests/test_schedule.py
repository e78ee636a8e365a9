"""The schedules' action tables against their closed forms (docs/architecture.md, "Delay schedule")."""

import math

import pytest

from petra_core.methods.schedule import GPipe, OneFOneB, Pipelined, Schedule, Sequential, fill_drain

KINDS = ("pipelined", "sequential", "gpipe", "1f1b")


@pytest.mark.parametrize("J,n", [(1, 3), (2, 5), (4, 7), (10, 25)])
def test_pipelined_matches_closed_form(J, n):
    s = Schedule("pipelined", J, n)
    assert s.num_ticks == n + 2 * (J - 1)
    seen_f, seen_b = set(), set()
    for t in range(s.num_ticks + 3):
        for j in range(J):
            a = s.action(t, j)
            f, b = t - j, t - 2 * (J - 1) + j
            assert a.forward == (f if 0 <= f < n else None)
            assert a.backward == (b if 0 <= b < n else None)
            if a.forward is not None:
                seen_f.add((a.forward, j))
            if a.backward is not None:
                seen_b.add((a.backward, j))
    everything = {(m, j) for m in range(n) for j in range(J)}
    assert seen_f == everything and seen_b == everything  # drained: every minibatch, every stage
    assert [s.staleness(j) for j in range(J)] == [2 * (J - 1 - j) for j in range(J)]
    # the head runs forward and backward of the same minibatch in one tick
    assert all(s.action(t, J - 1).forward == s.action(t, J - 1).backward for t in range(J - 1, n + J - 1))


@pytest.mark.parametrize("J,n", [(1, 2), (3, 4), (10, 3)])
def test_sequential_keeps_one_minibatch_in_flight(J, n):
    s = Schedule("sequential", J, n)
    when_f, when_b = {}, {}
    for t in range(s.num_ticks):
        for j in range(J):
            a = s.action(t, j)
            if a.forward is not None:
                when_f[a.forward, j] = t
            if a.backward is not None:
                when_b[a.backward, j] = t
    for m in range(n):
        for j in range(J - 1):
            assert when_f[m, j] < when_f[m, j + 1]  # forward goes up the stages
            assert when_b[m, j + 1] < when_b[m, j]  # backward comes down
        if m + 1 < n:  # next minibatch starts after this one's backward finished everywhere
            assert when_b[m, 0] < min(when_f[m + 1, j] for j in range(J))


@pytest.mark.parametrize("k", [1, 2])
def test_messages_arrive_one_tick_after_they_are_sent(k):
    for kind in ("pipelined", "sequential", "1f1b"):
        s = Schedule(kind, 5, 6, k=k)
        for t in range(s.num_ticks):
            for j in range(1, 5):
                f = s.action(t, j).forward
                if f is not None:
                    assert s.action(t - 1, j - 1).forward == f
                b = s.action(t, j - 1).backward
                if b is not None:
                    assert s.action(t - 1, j).backward == b


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_forward_and_backward_ticks_invert_the_table(kind, k):
    s = Schedule(kind, 4, 5, k=k)
    for t in range(s.num_ticks):
        for j in range(4):
            a = s.action(t, j)
            if a.forward is not None:
                assert s.forward_tick(a.forward, j) == t
            if a.backward is not None:
                assert s.backward_tick(a.backward, j) == t


def test_format_prints_a_table():
    text = Schedule("pipelined", 3, 4).format()
    lines = text.splitlines()
    assert lines[0].split() == ["tick", "stage", "0", "stage", "1", "stage", "2"]
    assert len(lines) == 1 + 4 + 4
    # stage 0 sends its activation up; the head's backward sends its gradient down, and it steps (k = 1)
    assert "F0>/." in lines[1] and "F0/B0<*" in lines[3]


def test_a_name_builds_its_schedule_type():
    assert (
        type(Schedule("gpipe", 3, 4, k=2)) is GPipe
        and type(Schedule(kind="1f1b", num_stages=3, num_batches=4)) is OneFOneB
    )
    assert type(Schedule("pipelined", num_stages=4, num_batches=3)) is Pipelined
    assert Sequential(3, 4) == Schedule("sequential", 3, 4)
    with pytest.raises(ValueError, match="unknown schedule 'zigzag'; allowed: pipelined, 1f1b, sequential, gpipe"):
        Schedule("zigzag", 3, 4)
    with pytest.raises(ValueError, match="accumulation k must be an integer >= 1, got 0"):
        GPipe(3, 4, k=0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("J,n", [(1, 3), (2, 1), (3, 2), (4, 10), (10, 3), (10, 40)])
@pytest.mark.parametrize("k", [1, 3])
def test_busy_is_exactly_the_stages_that_work(kind, J, n, k):
    """The runner only visits ``busy(t)``: it must hold every stage with work at t and no idle one."""
    s = Schedule(kind, J, n, k=k)
    for t in range(-2, s.num_ticks + 3):
        assert set(s.busy(t)) == {j for j in range(J) if s.action(t, j).busy}, (kind, J, n, t)


def when(s: Schedule) -> tuple[dict, dict, dict]:
    """(mb, stage) -> tick of its forward, of its backward; stage -> ticks it steps at."""
    f, b, steps = {}, {}, {j: [] for j in range(s.num_stages)}
    for t, row in enumerate(s.table()):
        for j, a in enumerate(row):
            assert a.forward is None or (a.forward, j) not in f, "a forward runs twice"
            assert a.backward is None or (a.backward, j) not in b, "a backward runs twice"
            if a.forward is not None:
                f[a.forward, j] = t
            if a.backward is not None:
                b[a.backward, j] = t
            if a.step:
                steps[j].append(t)
    return f, b, steps


def gpipe_group_ticks(J: int, s: int) -> int:
    """GPipe's group of s microbatches: the head's gradients wait until stage J-2's s forwards are done."""
    return s if J == 1 else s + max(s, 2) + 2 * J - 4


def onefoneb_group_ticks(J: int, s: int) -> int:
    return s + 2 * (J - 1)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("J,n,k", [(1, 4, 2), (2, 5, 2), (4, 6, 3), (4, 7, 3), (5, 6, 2), (3, 5, 1)])
def test_synchronous_pipelines_in_closed_form(kind, J, n, k):
    """GPipe and 1F1B: every stage forwards and backwards every minibatch once, backwards in forward
    order, steps once per group of k after its last backward, and no weight moves in flight; the
    tick count is the sum of the groups' lengths."""
    s = Schedule(kind, J, n, k=k)
    f, b, steps = when(s)
    everything = {(m, j) for m in range(n) for j in range(J)}
    assert set(f) == everything and set(b) == everything
    groups = [range(g, min(g + k, n)) for g in range(0, n, k)]
    for j in range(J):
        assert sorted(range(n), key=lambda m: b[m, j]) == list(range(n))  # backward order = forward order
        assert steps[j] == [b[g[-1], j] for g in groups]  # one step per group, after its last backward
        for m in range(n):  # no step of the stage between a minibatch's forward and its backward
            assert not any(f[m, j] <= t < b[m, j] for t in steps[j])
            assert b[m, j] - f[m, j] >= 0 and (j < J - 1 or f[m, j] == b[m, j])  # the head: one tick
    for g, h in zip(groups, groups[1:]):  # a flush: the next group enters after the last backward
        assert max(b[m, j] for m in g for j in range(J)) < min(f[m, j] for m in h for j in range(J))
    length = gpipe_group_ticks if kind == "gpipe" else onefoneb_group_ticks
    assert s.num_ticks == sum(length(J, len(g)) for g in groups)
    assert all(
        s.flushed(t) == (t + 1 in {sum(length(J, len(g)) for g in groups[: i + 1]) for i in range(len(groups))})
        for t in range(s.num_ticks)
    )
    assert [s.staleness(j) for j in range(J)] == [0] * J


@pytest.mark.parametrize("J,n,k", [(2, 4, 2), (4, 6, 3), (5, 8, 4), (3, 3, 1)])
def test_gpipe_runs_every_forward_before_any_backward_of_a_group(J, n, k):
    s = GPipe(J, n, k=k)
    f, b, _ = when(s)
    for g in range(0, n, k):
        group = range(g, min(g + k, n))
        for j in range(J - 1):
            assert max(f[m, j] for m in group) < min(b[m, j] for m in group)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("J,n,k", [(2, 4, 2), (4, 6, 3), (5, 8, 4)])
def test_a_message_is_consumed_when_its_receiver_runs_that_minibatch(kind, J, n, k):
    """Activations go up one stage a tick; gradients come down one stage a tick, but GPipe's head
    gradients wait at stage J-2 until its forwards are done: max(k, 2) - 1 ticks."""
    s = Schedule(kind, J, n, k=k)
    sent = {}
    for t, row in enumerate(s.table()):
        for j, a in enumerate(row):
            for msg in a.sends:
                sent[msg.direction, msg.mb, j, msg.peer] = t
            for msg in a.receives:
                waited = t - sent.pop((msg.direction, msg.mb, msg.peer, j))
                head_gradient = kind == "gpipe" and msg.direction == "backward" and msg.peer == J - 1
                assert waited == (max(k, 2) - 1 if head_gradient else 1), (msg, j, t)
    assert not sent  # every message sent is consumed


@pytest.mark.parametrize("J,k,groups", [(1, 2, 3), (2, 2, 1), (4, 3, 2), (5, 4, 2), (3, 1, 4)])
def test_bubble_fraction_in_closed_form(J, k, groups):
    """Idle (tick, stage) cells over all, with n = groups·k. 1F1B: stage j is busy k ticks forwarding
    and k backwarding, of which min(k, 2(J-1-j)) apart. GPipe: a stage's forwards and backwards never
    share a tick (but the head's)."""
    n = groups * k
    ones = OneFOneB(J, n, k=k)
    busy = J * k + sum(min(k, 2 * d) for d in range(J))
    assert math.isclose(ones.bubble_fraction(), 1 - busy / (J * onefoneb_group_ticks(J, k)))
    gpipe = GPipe(J, n, k=k)
    assert math.isclose(gpipe.bubble_fraction(), 1 - k * (2 * J - 1) / (J * gpipe_group_ticks(J, k)))
    if k == 1:  # one microbatch a flush is the sequential schedule: one stage of J busy at a time
        assert ones.table() == gpipe.table() == Sequential(J, n).table()
        assert math.isclose(gpipe.bubble_fraction(), 1 - 1 / J)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("J,k", [(4, 3), (5, 2)])
def test_in_flight_is_the_most_a_stage_holds(kind, J, k):
    s = Schedule(kind, J, 4 * J * k, k=k)
    f, b, _ = when(s)
    held = [
        max(sum(f[m, j] <= t < b[m, j] for m in range(s.num_batches)) for t in range(s.num_ticks)) for j in range(J)
    ]
    assert held == [s.in_flight(j) for j in range(J)]


def test_the_fill_and_drain_is_two_ticks_a_stage_but_the_heads():
    assert [fill_drain(J) for J in (1, 2, 18)] == [0, 2, 34]
    assert Sequential(18, 1).period == fill_drain(18) + 1


def test_petra_schedule_prints_the_table_with_steps_and_messages(capsys):
    from petra_core.cli import main

    assert main(["schedule", "--method", "gpipe", "--stages", "3", "--batches", "4", "-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    s = GPipe(3, 4, k=2)
    assert len(lines) == 1 + s.num_ticks + 1
    assert lines[3].split() == ["2", "./.", "F1>/.", "F0/B0<"]  # the head's gradient of 0 goes down
    assert lines[4].split() == ["3", "./.", "./B0<", "F1/B1<*"]  # the head steps at the end of its group
    assert lines[-1].startswith(f"gpipe: gpipe schedule, {s.num_ticks} ticks, bubble {s.bubble_fraction():.3f}")
