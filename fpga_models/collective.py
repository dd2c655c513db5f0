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


def ring_steps_array(r):
    """:func:`ring_steps` of every replica count in the array ``r`` (numpy, elementwise)."""
    import numpy as np
    r = np.asarray(r)
    return np.where(r > 1, 2 * (r - 1), 0)


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


# ---------------------------------------------------------------- the ring on FPGA links
# What the training RTL's all-reduce engine (hls_templates/rtl/train_allreduce.v.j2,
# codegen/rtl/train.py) moves: a board's exact weight-gradient sums, one flat vector of every
# dense layer's weights (tile order) then biases, each sum ``grad_sum_bits`` wide, cut into r
# shares of ``ring_share_elems``; each step's share is one message of the board-to-board
# transport (fpga_models.engines.link_*), and a replica sends its next step once the previous
# step's share has arrived whole (Patarasuk & Yuan's ring, store-and-forward per step).

def grad_sum_bits(elem_bits: int) -> int:
    """Bits of one weight-gradient sum the training engines keep and the ring carries: the
    product of two ``elem_bits`` values plus 16 bits of headroom (2 x 16 + 16 = 48 for fixed16;
    ``train_fixed.acc_width`` of the global batch must fit, which codegen.rtl.train checks)."""
    return 2 * elem_bits + 16


def ring_share_elems(n: int, r: int) -> int:
    """Sums per share: ceil(n / r) (the last share is padded with zeros)."""
    return -(-int(n) // r)


def ring_step_cycles(n: int, r: int, elem_bits: int, bytes_per_cycle, latency: int) -> tuple[int, float, int]:
    """(word lanes, cycles one step holds the hop, cycles from a step's last word leaving to its
    arrival) of a ring step carrying one share of ``n`` gradient sums over a transport hop of
    ``bytes_per_cycle`` and ``latency`` cycles: the share as one sample of
    ``engines.link_lanes`` sums a word (the one home of the link's timing)."""
    from . import engines
    bits = grad_sum_bits(elem_bits)
    share = ring_share_elems(n, r)
    lanes = engines.link_lanes(share, bits, bytes_per_cycle)
    words = -(-share // lanes)
    return (lanes, float(engines.link_sample_cycles(words, lanes * bits, bytes_per_cycle)),
            engines.link_delivery_cycles(words, lanes * bits, latency))


def ring_allreduce_cycles(n: int, r: int, elem_bits: int, bytes_per_cycle, latency: int) -> float:
    """Cycles of the whole ring on FPGA links: 2 (r - 1) steps, each its share's line time plus
    delivery (:func:`ring_step_cycles`); 0 for r <= 1."""
    if r <= 1:
        return 0.0
    _l, occ, lat = ring_step_cycles(n, r, elem_bits, bytes_per_cycle, latency)
    return ring_steps(r) * (occ + lat)


def ring_hop_s(nbytes, elem_bytes: int, r: int, bandwidth: float, latency: float, clock_hz: float | None):
    """(seconds one ring step holds a hop, seconds from its last word leaving to its arrival)
    of the ring over a hop of ``bandwidth`` (bytes/s) and ``latency`` (s) for a stage whose
    weights take ``nbytes`` in ``elem_bytes`` elements. Between FPGAs (``clock_hz`` the hop's
    transport clock, fpga_models.engines.link_clock) the step carries a share of the exact
    gradient sums (:func:`grad_sum_bits` each) framed by the transport
    (:func:`ring_step_cycles`); otherwise (GPUs, hosts) the share of the weight bytes, as is."""
    import math
    if clock_hz is None or not math.isfinite(bandwidth) or r <= 1:
        return ring_share(nbytes, r) / bandwidth, latency
    bpc = bandwidth / clock_hz
    lat_c = max(1, round(latency * clock_hz))
    n = int(round(float(nbytes) / elem_bytes))
    _l, occ, deliver = ring_step_cycles(n, r, 8 * elem_bytes, bpc, lat_c)
    return occ / clock_hz, latency + (deliver - lat_c) / clock_hz


def ring_allreduce_fpga_s(nbytes, elem_bytes: int, r: int, bandwidth: float, latency: float,
                          clock_hz: float | None):
    """Seconds of the whole ring, every hop alike: 2 (r - 1) x (:func:`ring_hop_s` busy + latency)."""
    if r <= 1:
        return 0.0
    occ, lat = ring_hop_s(nbytes, elem_bytes, r, bandwidth, latency, clock_hz)
    return ring_steps(r) * (occ + lat)
