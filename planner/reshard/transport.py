"""The transport a run between processes uses, measured, and the network model built from it.

``measure_transport`` times torch.distributed point-to-point messages between forked
processes on this machine: latency (half a ping-pong of a 4-byte message, median: under
load a blocked receiver's wake-up is part of every hop), one pair's bandwidth (the slope
between the fastest 4 MiB and 16 MiB rounds, each acknowledged by 4 bytes, so latency
cancels; other jobs only ever slow a copy down), and the aggregate bandwidth of several
pairs sending at once (on one machine every copy shares the CPU cores and memory, so pairs
do not add up).

``transport_network`` is the resharding cost model (``cost.Network``) for processes on
that transport: every process its own group, with one sending and one receiving port at
the measured pair bandwidth and the measured latency per hop. ``retime`` lays a plan's
transfers out on such a network in their issue order, with the same senders and trees:
the model's time for exactly what the processes ran.
"""
from __future__ import annotations

import multiprocessing as mp
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

from .cost import Network
from .strategies import Plan, _Timer

LAT_BYTES = 4
BW_BYTES = 16 << 20  # bandwidth: the slope between a 4 MiB and a 16 MiB message (latency cancels)
MID_BYTES = 4 << 20


@dataclass(frozen=True)
class Transport:
    """Measured point-to-point figures of a torch.distributed backend on this machine."""

    backend: str
    latency_s: float
    pair_Bps: float  # one sender, one receiver
    aggregate_Bps: float  # `pairs` disjoint pairs sending at once, total
    pairs: int
    latency_best_s: float = 0.0  # the fastest round trip: the transport when nothing preempts it
    pair_median_Bps: float = 0.0  # the slope of the median rounds (noisy under load)

    def to_dict(self) -> dict:
        """JSON form."""
        return asdict(self)


def _pair_rank(rank: int, world: int, store: str, backend: str, reps: int, conn) -> None:
    """Ranks 2k and 2k+1 form a pair. Pair 0 alone: ping-pong, then bulk messages; then every
    pair at once, each round started together by a barrier. Reports {phase: [seconds]}."""
    import os

    import torch
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group(backend, store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    peer = rank ^ 1
    small, ack = torch.zeros(LAT_BYTES // 4, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    big = torch.zeros(BW_BYTES // 4, dtype=torch.int32)
    mid = torch.zeros(MID_BYTES // 4, dtype=torch.int32)
    out: dict[str, list[float]] = {"lat": [], "mid": [], "bw": [], "agg": []}
    for phase, msg, reply, who, n in (("lat", small, small, 2, 4 * reps), ("mid", mid, ack, 2, reps),
                                      ("bw", big, ack, 2, reps), ("agg", big, ack, world, reps)):
        for _ in range(n + 1):  # the first round warms the connection up
            if phase == "agg":
                dist.barrier()
            if rank < who:
                t0 = time.perf_counter()
                if rank % 2 == 0:
                    dist.send(msg, peer)
                    dist.recv(reply, peer)
                else:
                    dist.recv(msg, peer)
                    dist.send(reply, peer)
                out[phase].append(time.perf_counter() - t0)
        dist.barrier()
    dist.destroy_process_group()
    conn.send(out)


def measure_transport(backend: str = "gloo", reps: int = 20, pairs: int = 2) -> Transport:
    """Measure latency, pair and aggregate bandwidth of ``backend`` between forked processes."""
    world = 2 * max(1, pairs)
    reps = max(3, reps)
    tmp = Path(tempfile.mkdtemp(prefix="bapipe-transport-"))
    ctx = mp.get_context("fork")
    procs, conns = [], []
    try:
        for r in range(world):
            a, b = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_pair_rank, args=(r, world, str(tmp / "store"), backend, reps, b), daemon=True)
            p.start()
            b.close()
            procs.append(p)
            conns.append(a)
        results = [c.recv() for c in conns]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    rounds = results
    return _figures(backend, rounds, world, pairs)


def _slope(big: float, mid: float) -> float:
    """Bytes/s from the times of a 16 MiB and a 4 MiB message (latency and the ack cancel);
    when noise makes the difference meaningless, the big message's own rate."""
    d = big - mid
    return (BW_BYTES - MID_BYTES) / d if d > 0.05 * big else BW_BYTES / big


def _figures(backend: str, rounds: list[dict], world: int, pairs: int) -> Transport:
    """Latency: the median half round trip (on a loaded machine, a blocked receiver's wake-up is
    part of every hop). Bandwidth: from the fastest rounds (a copy's rate when it runs;
    other jobs only ever make it slower), the slope between the two message sizes."""
    r0 = rounds[0]
    lat = statistics.median(r0["lat"][1:]) / 2
    pair_bps = _slope(min(r0["bw"][1:]), min(r0["mid"][1:]))
    fixed = max(0.0, min(r0["mid"][1:]) - MID_BYTES / pair_bps)
    # all pairs at once: each pair's fastest round, the slowest pair, its fixed cost taken off
    agg_t = max(min(rounds[r]["agg"][1:]) for r in range(0, world, 2)) - fixed
    med_bps = _slope(statistics.median(r0["bw"][1:]), statistics.median(r0["mid"][1:]))
    return Transport(backend, lat, pair_bps, pairs * BW_BYTES / max(agg_t, 1e-9), pairs,
                     min(r0["lat"][1:]) / 2, med_bps)


def transport_network(src_devices, dst_devices, tr: Transport) -> Network:
    """Processes on a measured transport: each its own group with one send and one receive
    port at the pair bandwidth; every hop pays the measured latency."""
    devs = tuple(dict.fromkeys(tuple(src_devices) + tuple(dst_devices)))
    group = {d: f"proc-{d}" for d in devs}
    ports = {d: tr.pair_Bps for d in devs}
    return Network(tuple(src_devices), tuple(dst_devices), group, ports, dict(ports),
                   {g: tr.pair_Bps for g in group.values()}, inter_latency_s=tr.latency_s,
                   intra_latency_s=tr.latency_s, name=f"{tr.backend}-processes")


def retime(plan: Plan, net: Network) -> Plan:
    """The plan's transfers (same senders, trees and issue order) list-scheduled on ``net``:
    a transfer starts when its ports are free and the transfers it waits for have finished."""
    timer = _Timer(net)
    free: dict = {}
    start, finish = [], []
    for tr in plan.transfers:
        bw, lat, res = timer.shape(tr.edges)
        t0 = max([free.get(r, 0.0) for r in res] + [finish[a] for a in tr.after] + [0.0])
        busy = t0 + tr.nbytes / bw
        for r in res:
            free[r] = busy
        start.append(t0)
        finish.append(busy + lat)
    return Plan(plan.name, plan.transfers, tuple(start), tuple(finish))
