"""One device of a resharding run between processes: the program each rank executes.

The rank holds its source tile (if it is a source device), posts a receive for every hop
that ends at it, then posts the sends of every hop that starts at it in the plan's order
(start time, then index): a hop whose data the rank received in this plan waits for that
receive first (a relay of a broadcast tree, or the entry device of a gather). Every hop
has its own tag, so messages match whatever order the transport delivers them in. After
the last send and receive, the rank assembles its destination tile only from what it held
and received and compares it bit for bit with the expected values.

Data: element i (row-major flat index of the global tensor) holds a hash of i, written as
raw bits of the element width and viewed as the dtype (floats may hold NaN patterns: no
arithmetic touches them, only copies, so bits must survive exactly).

Imports torch; loaded only inside the rank processes and by ``dist.py`` after checking
that torch is installed.
"""
from __future__ import annotations

import os
import time
from datetime import timedelta

import numpy as np

from .layout import Box, contains, intersect

#: bits per element -> (numpy unsigned type for the pattern, torch integer dtype name of that width)
_WIDTH = {1: (np.uint8, "uint8"), 2: (np.uint16, "int16"), 4: (np.uint32, "int32"), 8: (np.uint64, "int64")}
#: dtype names a run may carry (a subset of layout.DTYPE_BYTES) -> torch dtype name
TORCH_DTYPES = {"fp32": "float32", "float32": "float32", "fp16": "float16", "float16": "float16",
                "bf16": "bfloat16", "bfloat16": "bfloat16", "fp64": "float64", "float64": "float64",
                "int8": "int8", "uint8": "uint8", "fixed8": "int8", "int16": "int16", "fixed16": "int16",
                "int32": "int32", "fixed32": "int32", "int64": "int64"}


def pattern(box: Box, shape: tuple[int, ...], nbytes: int) -> np.ndarray:
    """The expected raw bits of a box of the global tensor (unsigned, ``nbytes`` per element)."""
    strides = [int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(len(shape))]
    flat = np.zeros([hi - lo for lo, hi in box], dtype=np.uint64)
    for d, (lo, hi) in enumerate(box):
        view = [1] * len(box)
        view[d] = hi - lo
        flat += (np.arange(lo, hi, dtype=np.uint64) * np.uint64(strides[d])).reshape(view)
    # a multiplicative hash (Knuth's constant): neighbours differ in every byte
    bits = flat * np.uint64(2654435761) + np.uint64(0x9E3779B97F4A7C15)
    bits ^= bits >> np.uint64(29)
    return bits.astype(_WIDTH[nbytes][0]) if nbytes < 8 else bits


def _as_tensor(torch, bits: np.ndarray, dtype: str):
    """Raw bits as a torch tensor of ``dtype`` (same element width)."""
    width = bits.dtype.itemsize
    signed = bits.view({1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[width])
    t = torch.from_numpy(np.ascontiguousarray(signed))
    return t.view(getattr(torch, dtype))


def _bits(torch, t) -> np.ndarray:
    """A tensor's raw bits as an unsigned numpy array."""
    width = t.element_size()
    ints = t.view({1: torch.uint8 if t.dtype == torch.uint8 else torch.int8, 2: torch.int16, 4: torch.int32,
                   8: torch.int64}[width])
    return ints.cpu().numpy().view(_WIDTH[width][0])


def _sl(box: Box, origin: Box) -> tuple[slice, ...]:
    return tuple(slice(lo - olo, hi - olo) for (lo, hi), (olo, _) in zip(box, origin))


def _init(torch, job: dict, rank: int):
    """Join the process group (a file store: no port to pick) and return the module."""
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback: never a real NIC, never a name lookup
    torch.set_num_threads(1)
    store = dist.FileStore(job["store"], job["world"])
    dist.init_process_group(job["backend"], store=store, rank=rank, world_size=job["world"],
                            timeout=timedelta(seconds=job["timeout_s"]))
    return dist


def run_rank(rank: int, job: dict, conn) -> None:
    """The whole life of one rank: init, move data, check the tile, report on ``conn``."""
    import torch

    dist = _init(torch, job, rank)
    me = job["devices"][rank]
    rank_of = {d: i for i, d in enumerate(job["devices"])}
    dev = torch.device("cuda", rank % max(1, torch.cuda.device_count())) if job["backend"] == "nccl" else None
    shape, nb, tdt = tuple(job["shape"]), job["nbytes"], job["torch_dtype"]
    held: list[tuple[Box, object, object]] = []  # (box, tensor, pending receive or None)
    if me in job["src_devices"]:
        box = job["src_tiles"][job["src_devices"].index(me)]
        t = _as_tensor(torch, pattern(box, shape, nb), tdt)
        held.append((box, t.to(dev) if dev else t, None))
    dist.barrier()
    t0 = time.perf_counter()
    sent: dict[str, int] = {}
    got: dict[str, int] = {}
    works = []
    for tag, (box, a, b) in enumerate(job["hops"]):  # every receive first: senders never wait on a post
        if b == me:
            buf = torch.empty([hi - lo for lo, hi in box], dtype=getattr(torch, tdt), device=dev)
            w = dist.irecv(buf, src=rank_of[a], tag=tag)
            held.append((box, buf, w))
            got[a] = got.get(a, 0) + buf.numel() * buf.element_size()
    fault = job.get("fault")
    for n, tag in enumerate(job["send_order"].get(me, ())):
        box, a, b = job["hops"][tag]
        data = _fetch(held, box)
        works.append(dist.isend(data, dst=rank_of[b], tag=tag))
        sent[b] = sent.get(b, 0) + data.numel() * data.element_size()
        if fault and n + 1 >= fault[1]:  # test hook: die with this send in flight
            works[-1].wait()
            os.kill(os.getpid(), 9)
    for w in works:
        w.wait()
    for _, _, w in held:
        if w is not None:
            w.wait()
    if dev is not None:
        torch.cuda.synchronize(dev)
    t1 = time.perf_counter()
    report = {"rank": rank, "device": me, "t0": t0, "t1": t1, "sent": sent, "received": got}
    report.update(_check(torch, job, me, held))
    dist.barrier()
    dist.destroy_process_group()
    conn.send(report)


def _fetch(held, box: Box):
    """A contiguous tensor of ``box`` from what this rank holds (waiting for a receive if needed)."""
    for k, (hb, t, w) in enumerate(held):
        if contains(hb, box):
            if w is not None:
                w.wait()
                held[k] = (hb, t, None)  # a gloo receive must not be waited for twice
            return t[_sl(box, hb)].contiguous()
    raise RuntimeError(f"asked to send {box} before holding it")  # the plan was checked: unreachable


def _check(torch, job: dict, me: str, held) -> dict:
    """Assemble this rank's destination tile; compare its bits with the expected ones."""
    if me not in job["dst_devices"]:
        return {}
    box = job["dst_tiles"][job["dst_devices"].index(me)]
    tile = torch.empty([hi - lo for lo, hi in box], dtype=getattr(torch, job["torch_dtype"]))
    filled = np.zeros(tuple(tile.shape), dtype=bool)
    for hb, t, _ in held:
        cut = intersect(hb, box)
        if cut is None:
            continue
        tile[_sl(cut, box)] = t[_sl(cut, hb)].cpu()
        filled[_sl(cut, box)] = True
    got = _bits(torch, tile)
    want = pattern(box, tuple(job["shape"]), job["nbytes"])
    out = {"missing": int((~filled).sum()), "wrong": int((got != want)[filled].sum()), "tile_box": box}
    if job.get("return_tiles"):
        out["tile_bits"] = got
    return out

