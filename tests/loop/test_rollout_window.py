"""The async pipeline's capacity, staleness bound and sliding-window strategies (docs/async.md):
what may start, what a step takes, what is dropped."""

import pytest

from dockyard.loop.rollout_window import DispatchWindow, pipeline_capacity


def test_capacity_is_int_of_b_times_one_plus_stale_steps():
    assert pipeline_capacity(16, 0) == 16
    assert pipeline_capacity(16, 1) == 32
    assert pipeline_capacity(16, 0.5) == 24
    assert pipeline_capacity(10, 0.25) == 12      # int(12.5): fractional capacity rounds down
    assert DispatchWindow(4, 1.5, "no-window").capacity == 10


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="windowed-fifo"):
        DispatchWindow(4, 1, "fifo")


def start(window, count, version):
    return [window.start(version) for _ in range(count)]


def test_no_staleness_is_synchronous_generation_waits_for_new_weights():
    window = DispatchWindow(4, 0, "no-window")
    assert window.startable(version=0) == 4
    numbers = start(window, 4, 0)
    assert window.startable(0) == 0                 # capacity B: one step's worth in flight
    for n in numbers:
        window.finish(n)
    assert window.take(4) == numbers
    # step 1 took its groups; more groups under version 0 would be a version old when trained
    assert window.startable(0) == 0
    assert window.startable(1) == 4


def test_one_step_of_staleness_runs_a_step_ahead_and_no_further():
    window = DispatchWindow(4, 1, "no-window")
    assert window.startable(0) == 8                 # capacity 2B
    first = start(window, 8, 0)
    for n in first:
        window.finish(n)
    assert window.take(4) == first[:4]              # the step training version 0
    # four slots are free, but a group started under version 0 now would be trained by the step
    # training version 2: two versions old
    assert window.startable(0) == 0
    assert window.startable(1) == 4
    assert window.drop_stale(trainer_version=1) == []
    assert window.take(4) == first[4:]              # lag 1: allowed


def test_too_stale_groups_are_dropped_at_take_time():
    window = DispatchWindow(2, 1, "no-window")
    old = start(window, 4, 0)
    window.finish(old[0])
    window.finish(old[1])
    assert window.take(2) == old[:2]
    window.finish(old[3])
    # the trainer moved on two versions before old[2] / old[3] were taken
    assert window.drop_stale(trainer_version=2) == [old[3]]
    assert window.open_numbers == [old[2]]
    window.finish(old[2])
    assert window.drop_stale(trainer_version=2) == [old[2]]
    assert window.take(1) is None


def test_no_window_takes_groups_in_finishing_order_and_refills_any_free_slot():
    window = DispatchWindow(2, 1, "no-window")
    a, b, c, d = start(window, 4, 0)
    window.finish(c)
    window.finish(a)
    assert window.take(2) == [c, a]                 # first to finish, first taken
    # b (a straggler) is still running; the two free slots open at once
    assert window.startable(1) == 2


def test_window_gated_holds_new_starts_behind_a_straggler():
    window = DispatchWindow(2, 1, "window-gated")
    a, b, c, d = start(window, 4, 0)
    window.finish(c)
    window.finish(d)
    assert window.take(2) == [c, d]                 # still finishing order
    # slots are free, but the window runs from the oldest open group (a): numbers a .. a+3 only
    assert window.startable(1) == 0
    window.finish(a)
    window.finish(b)
    assert window.take(2) == [a, b]
    assert window.startable(2) == 4


def test_windowed_fifo_takes_groups_in_start_order_only():
    window = DispatchWindow(2, 1, "windowed-fifo")
    a, b, c, d = start(window, 4, 0)
    window.finish(b)
    window.finish(c)
    window.finish(d)
    assert window.take(2) is None                   # a has not finished: b, c, d wait behind it
    window.finish(a)
    assert window.take(2) == [a, b]
    assert window.take(2) == [c, d]


@pytest.mark.parametrize("strategy", ["no-window", "window-gated", "windowed-fifo"])
@pytest.mark.parametrize("stale", [0, 0.5, 1, 2])
def test_every_strategy_keeps_lag_within_the_bound_in_a_simulated_run(strategy, stale):
    """A pipeline simulated step by step (groups finish in a scrambled order, the fleet installs a
    step's weights a while into the next step): nothing is ever trained more than ceil(stale) versions old, the
    capacity is never exceeded, and the run keeps training."""
    import math
    import random

    rng = random.Random(7)
    window = DispatchWindow(4, stale, strategy)
    started_under: dict[int, int] = {}
    fleet_version, published, steps, running = 0, 0, 0, []
    for trainer_version in range(40):
        taken = None
        for moment in range(6):                     # the fleet starts and finishes groups meanwhile
            if moment == 1:
                fleet_version = published           # the refit lands after the step began
            for _ in range(window.startable(fleet_version)):
                number = window.start(fleet_version)
                started_under[number] = fleet_version
                running.append(number)
            assert len(window.open_numbers) <= window.capacity
            rng.shuffle(running)
            for n in running[:3]:
                window.finish(n)
            running = running[3:]
            window.drop_stale(trainer_version)
            taken = window.take(4)
            if taken is not None:
                break
        assert taken is not None, f"step training version {trainer_version} got no groups"
        assert all(trainer_version - started_under[n] <= math.ceil(stale) for n in taken)
        steps += 1
        published = trainer_version + 1
    assert steps == 40
