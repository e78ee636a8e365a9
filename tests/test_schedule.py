"""The delay schedule against its closed form (docs/architecture.md, "Delay schedule")."""

import pytest

from petra_core.engine.schedule import Schedule


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


def test_messages_arrive_one_tick_after_they_are_sent():
    for kind in ("pipelined", "sequential"):
        s = Schedule(kind, 5, 6)
        for t in range(s.num_ticks):
            for j in range(1, 5):
                f = s.action(t, j).forward
                if f is not None:
                    assert s.action(t - 1, j - 1).forward == f
                b = s.action(t, j - 1).backward
                if b is not None:
                    assert s.action(t - 1, j).backward == b


@pytest.mark.parametrize("kind", ["pipelined", "sequential"])
def test_forward_and_backward_ticks_invert_the_table(kind):
    s = Schedule(kind, 4, 5)
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
    assert "F0/." in lines[1] and "F0/B0" in lines[3]


def test_bad_schedule_kind():
    with pytest.raises(ValueError, match="allowed: pipelined, sequential"):
        Schedule("gpipe", 3, 4)


@pytest.mark.parametrize("kind", ["pipelined", "sequential"])
@pytest.mark.parametrize("J,n", [(1, 3), (2, 1), (3, 2), (4, 10), (10, 3), (10, 40)])
def test_busy_is_exactly_the_stages_that_work(kind, J, n):
    """The runner only visits ``busy(t)``: it must hold every stage with work at t and no idle one."""
    s = Schedule(kind, J, n)
    for t in range(-2, s.num_ticks + 3):
        assert set(s.busy(t)) == {j for j in range(J) if s.action(t, j).busy}, (kind, J, n, t)
