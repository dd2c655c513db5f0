"""Run a resharding plan between OS processes over torch.distributed (gloo; nccl on GPUs).

One process per device of the source and destination meshes (a board in both meshes is
one process). Each hop of the plan's transfers (a p2p send, a broadcast tree's edges, a
gather's entry and fan-out) becomes one tagged ``isend``/``irecv`` pair of real tensors
between the two ranks (``dist_rank.py``). The parent process only starts the ranks, waits
for their reports and watches them: a rank that dies is named (device, rank, pid, signal)
and the others are killed; no tile of a failed run is kept or returned.

torch is an optional extra (``pip install 'bapipe[torch]'``): imported only here, lazily.
"""
from __future__ import annotations

import multiprocessing as mp
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bapipe.errors import SpecError

from .layout import Layout, device_tiles
from .strategies import Plan
from .dist_rank import TORCH_DTYPES

#: the one line a command without torch prints (exit 2)
NEED_TORCH = "needs PyTorch, which is not installed: pip install 'bapipe[torch]' (the [torch] extra)"


class TransferFailure(RuntimeError):
    """A rank died or hung mid-transfer (its device is named); no result was kept."""


@dataclass
class DistResult:
    """What a run between processes measured."""

    bit_exact: bool
    measured_s: float  # first rank's start (after a barrier) to the last rank's end
    ranks: int
    backend: str
    sent_bytes: dict[str, int]  # per device, measured: bytes of the tensors it passed to isend
    link_bytes: dict[tuple[str, str], int]  # per directed pair, measured at the sender
    received_bytes: dict[str, int]  # per device, measured at the receiver
    plan_sent_bytes: dict[str, int]
    plan_link_bytes: dict[tuple[str, str], int]
    wrong_elements: int = 0
    missing_elements: int = 0
    tiles: dict[str, object] = field(default_factory=dict)  # raw bits per destination device (return_tiles)

    @property
    def bytes_match_plan(self) -> bool:
        """Bytes sent per device and per link, and received per device, equal the plan's."""
        recv: dict[str, int] = {}
        for (_, b), n in self.plan_link_bytes.items():
            recv[b] = recv.get(b, 0) + n
        return (self.sent_bytes == self.plan_sent_bytes and self.link_bytes == self.plan_link_bytes
                and self.received_bytes == recv)


def require_torch():
    """The torch module, or SpecError with the one line naming the extra."""
    try:
        import torch  # noqa: F401
        import torch.distributed as dist
    except ImportError:
        raise SpecError(None, None, "--execute", NEED_TORCH) from None
    if not dist.is_available():
        raise SpecError(None, None, "--execute", "this PyTorch build has no torch.distributed")
    return torch


def plan_hops(plan: Plan) -> tuple[list, dict[str, list[int]]]:
    """Every hop as (box, src, dst), tagged by its index; per sender its hops in plan order
    (start time, then transfer index, then the tree's edge order: parents first)."""
    hops, order = [], {}
    by_transfer = []
    for tr in plan.transfers:
        by_transfer.append([])
        for a, b in tr.edges:
            by_transfer[-1].append(len(hops))
            hops.append((tr.box, a, b))
    for i in sorted(range(len(plan.transfers)), key=lambda i: (plan.start_s[i], i)):
        for tag in by_transfer[i]:
            order.setdefault(hops[tag][1], []).append(tag)
    return hops, order


def planned_bytes(plan: Plan) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """Bytes the plan sends per device and per directed pair (every hop carries its box)."""
    dev: dict[str, int] = {}
    link: dict[tuple[str, str], int] = {}
    for tr in plan.transfers:
        for a, b in tr.edges:
            dev[a] = dev.get(a, 0) + tr.nbytes
            link[(a, b)] = link.get((a, b), 0) + tr.nbytes
    return dev, link


def execute_distributed(plan: Plan, shape, dtype: str, src_mesh, src_layout: Layout, dst_mesh,
                        dst_layout: Layout, src_devices, dst_devices, backend: str = "gloo",
                        timeout_s: float = 120.0, fault: tuple[str, int] | None = None,
                        return_tiles: bool = False) -> DistResult:
    """Run ``plan`` between one process per device; every destination tile checked bit for bit.

    ``dtype``: a name of ``dist_rank.TORCH_DTYPES``; ``backend``: ``gloo`` (CPU) or ``nccl``
    (GPUs). ``fault=(device, n)``: that device's process kills itself after its n-th send
    completes (tests). Raises TransferFailure naming a dead or hung rank.
    """
    torch = require_torch()
    if dtype not in TORCH_DTYPES:
        raise SpecError(None, None, "--dtype", f"{dtype!r} cannot be executed; expected one of "
                                               f"{', '.join(TORCH_DTYPES)}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise SpecError(None, None, "backend", "nccl needs CUDA GPUs; this machine has none (use gloo)")
    shape = tuple(shape)
    devices = list(dict.fromkeys(tuple(src_devices) + tuple(dst_devices)))
    hops, order = plan_hops(plan)
    tmp = Path(tempfile.mkdtemp(prefix="bapipe-reshard-"))
    job = {"shape": shape, "nbytes": torch.empty(0, dtype=getattr(torch, TORCH_DTYPES[dtype])).element_size(),
           "torch_dtype": TORCH_DTYPES[dtype], "devices": devices, "world": len(devices),
           "src_devices": list(src_devices), "dst_devices": list(dst_devices),
           "src_tiles": device_tiles(shape, tuple(src_mesh), src_layout),
           "dst_tiles": device_tiles(shape, tuple(dst_mesh), dst_layout),
           "hops": hops, "send_order": order, "backend": backend, "timeout_s": timeout_s,
           "store": str(tmp / "store"), "return_tiles": return_tiles}
    try:
        reports = _run_ranks(job, fault, timeout_s)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _summarise(plan, job, reports)


def _run_ranks(job: dict, fault, timeout_s: float) -> list[dict]:
    """Fork the ranks, collect one report each; on a death or a hang kill them all and raise."""
    ctx = mp.get_context("fork")  # the parent imported torch once; forked ranks share it
    from .dist_rank import run_rank

    procs, conns = [], []
    for r, dev in enumerate(job["devices"]):
        parent, child = ctx.Pipe(duplex=False)
        rjob = dict(job, fault=fault if fault and fault[0] == dev else None)
        p = ctx.Process(target=_rank_entry, args=(run_rank, r, rjob, child), daemon=True,
                        name=f"reshard-{dev}")
        p.start()
        child.close()
        procs.append(p)
        conns.append(parent)
    reports: dict[int, dict] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(reports) < len(procs):
            for r, c in enumerate(conns):
                if r not in reports and c.poll():
                    try:
                        reports[r] = c.recv()
                    except EOFError:  # its end of the pipe closed without a report: it died
                        procs[r].join(5)
                        raise TransferFailure(_death(job, r, procs[r])) from None
            for r, p in enumerate(procs):
                if r not in reports and not p.is_alive() and not conns[r].poll():
                    raise TransferFailure(_death(job, r, p))
            if time.monotonic() > deadline:
                silent = [job["devices"][r] for r in range(len(procs)) if r not in reports]
                raise TransferFailure(f"reshard: no report from {', '.join(silent)} after {timeout_s:.0f} s "
                                      "(hung); every rank was stopped and no destination tile was kept")
            time.sleep(0.005)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5)
    return [reports[r] for r in range(len(procs))]


def _rank_entry(fn, rank, job, conn) -> None:
    """A rank's process: the default SIGTERM (not the CLI's handler), its program, errors reported."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the parent, which kills the ranks
    try:
        fn(rank, job, conn)
    except BaseException as e:  # a transport error: report it, exit non-zero
        try:
            conn.send({"rank": rank, "error": f"{type(e).__name__}: {e}".splitlines()[0]})
        finally:
            raise SystemExit(1)


def _death(job: dict, r: int, p) -> str:
    """The one line naming a rank that died before reporting."""
    code = p.exitcode
    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    role = " and ".join(k for k, key in (("source", "src_devices"), ("destination", "dst_devices"))
                        if job["devices"][r] in job[key])
    return (f"reshard: device {job['devices'][r]} ({role}, rank {r}, pid {p.pid}) died mid-transfer ({how}); "
            "every rank was stopped and no destination tile was kept")


def _summarise(plan: Plan, job: dict, reports: list[dict]) -> DistResult:
    """Fold the rank reports into a DistResult (a rank's error report raises TransferFailure)."""
    for rep in reports:
        if "error" in rep:
            dev = job["devices"][rep["rank"]]
            raise TransferFailure(f"reshard: device {dev} (rank {rep['rank']}) failed: {rep['error']}; "
                                  "no destination tile was kept")
    sent, link, recv = {}, {}, {}
    for rep in reports:
        dev = rep["device"]
        if rep["sent"]:
            sent[dev] = sum(rep["sent"].values())
        for b, n in rep["sent"].items():
            link[(dev, b)] = n
        if rep["received"]:
            recv[dev] = sum(rep["received"].values())
    plan_dev, plan_link = planned_bytes(plan)
    dst = [r for r in reports if "tile_box" in r]
    wrong = sum(r["wrong"] for r in dst)
    missing = sum(r["missing"] for r in dst)
    return DistResult(bit_exact=wrong == 0 and missing == 0 and len(dst) == len(job["dst_devices"]),
                      measured_s=max(r["t1"] for r in reports) - min(r["t0"] for r in reports),
                      ranks=len(reports), backend=job["backend"], sent_bytes=sent, link_bytes=link,
                      received_bytes=recv, plan_sent_bytes=plan_dev, plan_link_bytes=plan_link,
                      wrong_elements=wrong, missing_elements=missing,
                      tiles={r["device"]: r["tile_bits"] for r in dst if "tile_bits" in r})
