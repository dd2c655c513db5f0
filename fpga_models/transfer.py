"""The link model both event loops share (the planner's replay, ``planner.pipeline``, and
the simulator, ``fpga_models.sim``): a transfer holds every link of its route at once
(cut-through), first come first served, from when its data is ready and all of them are
free, for its occupancy (bytes / bandwidth), and arrives its latency after that.
"""
from __future__ import annotations


def hold(free, ids, now: float, occ: float) -> float:
    """Start of a transfer over links ``ids`` whose data is ready at ``now``: the latest of
    ``now`` and when each link is free (``free[i]``); every link is then held until start +
    ``occ`` (``free`` updated). Returns the start."""
    start = now
    for i in ids:
        f = free[i]
        if f > start:
            start = f
    end = start + occ
    for i in ids:
        free[i] = end
    return start
