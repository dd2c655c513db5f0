"""codegen.check.jobs: how many of `bapipe csim`'s jobs hold a core at once, and which goes next."""
from __future__ import annotations

import threading

import pytest

from bapipe.codegen.check import jobs
from bapipe.errors import SpecError


def _wait_until(cond) -> None:
    """Until ``cond()`` holds (a state of the threads, not a time)."""
    ev = threading.Event()
    while not cond():
        ev.wait(0.001)


def test_a_freed_slot_goes_to_the_most_urgent_waiter():
    """One slot held; waiters arrive with priorities 3, 1, 2, 1: they get it in the order 1, 1
    (first come first), 2, 3."""
    slots = jobs.Slots(1)
    order, threads = [], []

    def job(name, prio):
        with slots.hold(prio):
            order.append(name)

    with slots.hold((0,)):
        for name, prio in (("c", (3,)), ("a1", (1,)), ("b", (2,)), ("a2", (1,))):
            threads.append(threading.Thread(target=job, args=(name, prio)))
            threads[-1].start()
            _wait_until(lambda n=len(threads): len(slots._waiting) == n)   # queued in this order
    for t in threads:
        t.join()
    assert order == ["a1", "a2", "b", "c"]


def test_never_more_holders_than_slots_and_grow_adds_one():
    """Two slots, six jobs that each wait for a go: two hold at once, never three; grow(1) lets a
    third in."""
    slots = jobs.Slots(2)
    inside, most, lock = [0], [0], threading.Lock()
    go = threading.Event()

    def job():
        with slots.hold((1,)):
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            go.wait()
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=job) for _ in range(6)]
    for t in threads:
        t.start()
    _wait_until(lambda: inside[0] == 2 and len(slots._waiting) == 4)
    assert most[0] == 2
    slots.grow(1)
    _wait_until(lambda: inside[0] == 3 and len(slots._waiting) == 3)
    go.set()
    for t in threads:
        t.join()
    assert most[0] == 3 and inside[0] == 0


def test_stop_turns_every_waiter_away():
    slots = jobs.Slots(1)
    got = []

    def job():
        try:
            with slots.hold((1,)):
                got.append("ran")
        except jobs.Stopped:
            got.append("stopped")

    with slots.hold((0,)):
        t = threading.Thread(target=job)
        t.start()
        _wait_until(lambda: len(slots._waiting) == 1)
        slots.stop()
        t.join()
    assert got == ["stopped"]


def test_cores_reads_bapipe_csim_jobs(monkeypatch):
    monkeypatch.setenv("BAPIPE_CSIM_JOBS", "3")
    assert jobs.cores() == 3
    monkeypatch.delenv("BAPIPE_CSIM_JOBS")
    assert 1 <= jobs.cores() <= jobs.MAX_JOBS
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("BAPIPE_CSIM_JOBS", bad)
        with pytest.raises(SpecError, match="BAPIPE_CSIM_JOBS"):
            jobs.cores()
