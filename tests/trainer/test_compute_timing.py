"""The compute clock (paralleljob_trainer.compute_timing): blocked time inside compute is taken back out."""

from __future__ import annotations

import time

from paralleljob_trainer.compute_timing import ComputeClock, blocking, lower_quartile

BLOCKED_SECONDS = 0.3


def test_a_collective_inside_compute_is_not_compute() -> None:
    clock = ComputeClock()
    clock.start(cuda=False)
    with clock.compute(), clock.blocked():
        time.sleep(BLOCKED_SECONDS)
    # Whatever the machine's load, compute is the outer section less the inner one: never the blocked time.
    assert 0.0 <= clock.take() < BLOCKED_SECONDS


def test_compute_is_counted_and_take_starts_again() -> None:
    clock = ComputeClock()
    clock.start(cuda=False)
    with clock.compute():
        time.sleep(BLOCKED_SECONDS)
    assert clock.take() >= BLOCKED_SECONDS
    assert clock.take() == 0.0


def test_blocked_outside_compute_and_a_stopped_clock_count_nothing() -> None:
    clock = ComputeClock()
    with clock.compute():  # not started: the trainer ran with the straggler window 0
        time.sleep(0.01)
    clock.start(cuda=False)
    with clock.blocked():  # a pipeline send, say: never inside a compute instruction
        time.sleep(0.01)
    assert clock.take() == 0.0


def test_the_window_figure_is_the_lower_quartile_step() -> None:
    # 20 steps, three descheduled ones (noise only adds time): the figure stays the rank's own speed.
    steps = [1.0 + 0.01 * i for i in range(17)] + [9.0, 9.0, 9.0]
    assert lower_quartile(steps) == 1.04
    assert lower_quartile([3.0]) == 3.0


def test_a_wrapped_collective_inside_compute_is_blocked_time() -> None:
    # What attach does to deepspeed.comm's collectives: clipping's norm all-reduce inside the optimizer step
    # waits on the replica's other stages, and that wait is not this rank's compute.
    clock = ComputeClock()
    clock.start(cuda=False)
    slow_collective = blocking(lambda: time.sleep(BLOCKED_SECONDS), clock)
    with clock.compute():
        slow_collective()
    assert 0.0 <= clock.take() < BLOCKED_SECONDS
