"""The ring all-reduce, the one collective the planner, the simulator and the training
kernels use (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 2009): r replicas in a ring, each holding ``nbytes`` of gradients cut
into r shares; a reduce-scatter of r - 1 steps then an all-gather of r - 1 steps, replica
i sending one share to replica i + 1 per step.

- :func:`ring_steps`: 2 (r - 1) steps; :func:`ring_share`: nbytes / r moved per hop and step;
- :func:`ring_allreduce_s`: seconds on a ring whose every hop has ``bandwidth`` and
  ``latency``: 2 (r - 1) / r x nbytes / bandwidth + 2 (r - 1) x latency.

The event replays (``planner.pipeline``, ``fpga_models.sim``) run the same steps hop by hop
on the links instead, so hops shared with other traffic queue.
"""
from __future__ import annotations


def ring_steps(r: int) -> int:
    """Steps of a ring all-reduce over r replicas: r - 1 reduce-scatter + r - 1 all-gather."""
    return 2 * (r - 1) if r > 1 else 0


def ring_share(nbytes, r: int):
    """Bytes one replica sends per step: its 1/r share of the gradients."""
    return nbytes / r


def ring_allreduce_s(nbytes, r: int, bandwidth: float, latency: float):
    """Seconds of a ring all-reduce of ``nbytes`` over r replicas, every hop with ``bandwidth``
    (bytes/s) and ``latency`` (s): 2(r-1)/r x nbytes / bandwidth + 2(r-1) x latency (0 for
    r <= 1). ``nbytes`` may be a numpy array (the planner prices many stages at once)."""
    if r <= 1:
        return 0.0
    return 2 * (r - 1) / r * nbytes / bandwidth + 2 * (r - 1) * latency
