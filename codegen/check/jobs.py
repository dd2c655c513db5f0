"""The jobs of one `bapipe csim` run side by side on the machine's cores: g++ compiles and kernel
runs (each with its numpy check), at most ``cores()`` of them at a time, the most urgent first.

A kernel run is one thread (bapipe_csim.h runs a kernel's DATAFLOW processes as coroutines) and
g++ one process, so a job holds one core. csim.py decides the order (the forward chain first:
every stage waits for the one before it; the backward kernels fill the other cores).
"""
from __future__ import annotations

import itertools
import os
import threading
from contextlib import contextmanager

#: most jobs at once whatever the core count: a vgg16 kernel run takes up to 2.3 GB (stage3_bwd)
MAX_JOBS = 4


def cores() -> int:
    """Jobs at once: ``$BAPIPE_CSIM_JOBS`` when set (1: one after another), else the cores this
    process may run on, at most MAX_JOBS."""
    env = os.environ.get("BAPIPE_CSIM_JOBS")
    if env:
        from bapipe.errors import SpecError

        if not env.isdigit() or int(env) < 1:
            raise SpecError(None, None, "BAPIPE_CSIM_JOBS", f"expected a positive integer, got {env!r}")
        return int(env)
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, MAX_JOBS))


class Stopped(RuntimeError):
    """The run is stopping (an error or a signal elsewhere): a job waiting for a core gives up."""


class Slots:
    """At most ``n`` holders at a time; a freed slot goes to the waiter with the lowest
    priority (first come first among equals)."""

    def __init__(self, n: int):
        self._free = n
        self._cv = threading.Condition()
        self._waiting: list[tuple] = []
        self._seq = itertools.count()
        self._stopped = False

    @contextmanager
    def hold(self, priority: tuple):
        """Hold a slot for the block; raises Stopped once ``stop`` was called."""
        with self._cv:
            me = (priority, next(self._seq))
            self._waiting.append(me)   # a few jobs: the first of them found by min()
            while not self._stopped and not (self._free > 0 and min(self._waiting) == me):
                self._cv.wait()
            self._waiting.remove(me)
            if self._stopped:
                raise Stopped("the C-simulation is stopping")
            self._free -= 1
            self._cv.notify_all()   # another slot may be free for the next waiter
        try:
            yield
        finally:
            with self._cv:
                self._free += 1
                self._cv.notify_all()

    def grow(self, n: int) -> None:
        """``n`` more slots from now on."""
        with self._cv:
            self._free += n
            self._cv.notify_all()

    def stop(self) -> None:
        """No waiter gets a slot from now on (each raises Stopped)."""
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
