"""The decode-thread tuner (app/runtimes/threads.py) on synthetic step times: it moves to
fewer threads when the machine gets busy (and that is faster), back when the load goes, and
stays put on a quiet machine's noise when fewer threads would be slower."""

from __future__ import annotations

from collections.abc import Callable

from app.runtimes.threads import EXPLORE_EVERY, WINDOW, ThreadTuner


def run(tuner: ThreadTuner, cost: Callable[[int], float], steps: int, batch: int = 1) -> None:
    """``steps`` decode steps, each taking ``cost(current threads)`` seconds."""
    for _ in range(steps):
        tuner.observe(cost(tuner.current), batch)


QUIET = {1: 0.020, 2: 0.011}  # seconds per step: two threads nearly twice as fast
BUSY = {1: 0.022, 2: 0.045}  # another program on one core: two threads wait for each other


def test_quiet_machine_keeps_every_thread() -> None:
    t = ThreadTuner(2)
    run(t, QUIET.__getitem__, WINDOW * 200)
    assert t.current == 2 and t.changes == 0


def test_contention_moves_to_fewer_threads_and_back_when_it_ends() -> None:
    t = ThreadTuner(2)
    run(t, QUIET.__getitem__, WINDOW * 4)
    run(t, BUSY.__getitem__, WINDOW * 3)  # one slowed window, one trial window
    assert t.current == 1
    run(t, BUSY.__getitem__, WINDOW * EXPLORE_EVERY * 3)  # tries 2 now and then, stays at 1
    assert t.current == 1
    run(t, QUIET.__getitem__, WINDOW * (EXPLORE_EVERY + 2))  # the load is gone
    assert t.current == 2


def test_a_slow_window_that_fewer_threads_do_not_fix_goes_back() -> None:
    """Slower for every count (a bigger model's long context, say): the trial loses."""
    t = ThreadTuner(2)
    run(t, QUIET.__getitem__, WINDOW * 4)
    slower = {1: 0.040, 2: 0.022}
    run(t, slower.__getitem__, WINDOW * 3)
    assert t.current == 2 and t.changes == 2  # tried 1, went back


def test_batch_sizes_are_measured_apart() -> None:
    """A step of 4 sequences costs more than one of 1: never read as contention."""
    t = ThreadTuner(2)
    for i in range(WINDOW * 40):
        batch = 1 if (i // (WINDOW * 2)) % 2 == 0 else 4
        t.observe(QUIET[t.current] * (3 if batch == 4 else 1), batch)
    assert t.current == 2 and t.changes == 0


def test_a_longer_context_is_not_read_as_contention() -> None:
    """A step at a 1,100-token context attends over more cells and is slower on a quiet
    machine too (measured: a follow-up turn after short chats was moved to one thread and
    reported "CPU busy"): contexts in other buckets are timed apart."""
    t = ThreadTuner(2)
    for n in range(WINDOW * 6):  # short chats
        t.observe(QUIET[t.current], 1, context=40 + n % 128)
    for n in range(WINDOW * 6):  # a long conversation's turn: twice as slow per step
        t.observe(QUIET[t.current] * 2, 1, context=1100 + n)
    assert t.current == 2 and t.changes == 0


def test_one_thread_never_goes_lower() -> None:
    t = ThreadTuner(1)
    run(t, BUSY.__getitem__, WINDOW * 50)
    assert t.current == 1 and t.changes == 0


def test_a_trial_cut_short_by_another_shape_goes_back() -> None:
    """A trial of fewer threads begun late in one shape (the last window of a batch of 8
    streams) is not judged on another's steps (the next request alone, naturally faster): it
    goes back. It used to be kept, and a quiet machine decoded with one thread from then on."""
    t = ThreadTuner(2)
    for _ in range(WINDOW * 2):
        t.observe(QUIET[t.current] * 4, 8)
    for _ in range(WINDOW):  # slower, at the same shape: a trial of one thread begins
        t.observe(QUIET[t.current] * 6, 8)
    assert t.current == 1
    for _ in range(WINDOW * 4):  # the streams ended; one request decodes alone
        t.observe(QUIET[t.current], 1)
    assert t.current == 2
