"""Cycle-approximate discrete-event simulation of a plan on its cluster.

The plan is the one source of truth for how long each stage computes (``fwd_s``,
``bwd_s``) and how many bytes cross each cut (``send_bytes``); the simulator decides
nothing the planner decided. Its job is what the planner's closed forms leave out or
approximate: the exact op order of every device (``bapipe.schedules.device_ops``), the
dependencies between devices, links with bandwidth, latency, sharing and credit-based
flow control, host PCIe input and output, the ring all-reduce of replicated stages, and
memory (weights plus live activation stashes) over time.

Model, per pipeline position (device) d:

* one compute engine runs d's ops in order; an op starts when the previous one ended,
  its input (activation from the previous virtual stage, gradient from the next, or the
  host's input batch) has arrived, and its output channel has a free transmit slot;
* replicas of a stage and the boards of a replica's mesh work in lock-step, each on its
  share of every micro-batch, in the plan's per-replica ``fwd_s``/``bwd_s`` (see
  ``op_seconds``); every board of the device shows the same timeline;
* a channel (stage -> next stage, gradient back, host -> first stage, last stage ->
  host) has a receive buffer of ``rx_credits`` micro-batches (default: the fewest that
  cover the credit round trip at the consumer's rate, at least 2): a transfer needs a credit,
  the receiver returns it (after the reverse path latency) when the consuming op starts;
  the sender keeps ``tx_slots`` finished outputs waiting for credits and otherwise stalls;
* a transfer reserves every directed link of its route for bytes / slowest-bandwidth
  seconds (cut-through, first come first served) and arrives after the route latency;
  between FPGA boards the bytes are the board-to-board transport's line bytes and its
  framing adds latency (``fpga_models.engines.link_transfer``, as the planner prices it);
* a replicated stage all-reduces its gradients (its ``weight_bytes``) in a ring of
  2(r-1) steps of 1/r of the bytes once its last backward ends (or, with
  ``allreduce_per="device"``, the planner's rule: one ring per device after its last
  backward); schedules with a flush
  start the next iteration on a device only when all of its stages have reduced;
  PipeDream-2BW runs iterations back to back (1F1B over N*m micro-batches, no flush) and
  needs iteration k's reduction only before iteration k+2 starts; asynchronous PipeDream
  runs the same stream, all-reduces a replicated stage's gradient after every backward
  (per-micro-batch updates) and only holds B(k) until the all-reduce of micro-batch k-2
  has ended (``bapipe.schedules.allreduce_gate``: two gradient buffers), forwards never wait
  (weight stashing; planner.pipeline.replay_pipedream is the same rule).

Times are float seconds; per-board cycle counts use each board's own clock.
"""
from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque
from dataclasses import dataclass, field

from bapipe.errors import SpecError
from bapipe.schedules import ASYNC, allreduce_gate, device_ops, stream_ops

from .collective import ring_hop_s, ring_share, ring_steps
from .transfer import hold
from .engines import link_clock, link_transfer

# event codes
_OP_DONE, _ARRIVE, _CREDIT, _AR_ARRIVE, _TAIL = 0, 1, 2, 3, 4
KINDS = ("F", "B", "W")
_push = heapq.heappush
_KIND_CODE = {"F": 0, "B": 1, "W": 2}


@dataclass
class SimConfig:
    """Knobs of the hardware model that the plan does not fix."""

    rx_credits: int | None = None       # receive-buffer slots per channel (micro-batches); None: auto
    rx_buffer_bytes: int | None = None  # if set: credits = max(1, bytes // message bytes)
    tx_slots: int = 1                   # finished outputs a sender may hold while out of credits
    host_io: bool = True                # model host PCIe input (first stage) and output (inference)
    prefetch_input: bool = True         # the first receive buffer's worth of input is on the board at t=0
    allreduce: bool = True              # simulate the ring all-reduce of replicated stages
    record: bool = True                 # keep op / transfer records for the Gantt chart and trace
    allreduce_per: str = "stage"        # "stage": each stage (chunk) reduces after its own last backward;
                                        # "device": one ring of all the device's weights after its last backward
    kernel_tails: bool = True           # the HLS flush/update kernels after a stage's last backward (the
                                        # plan's flush_s/update_s); False for a build without them (the
                                        # training RTL updates as its weight gradients finish:
                                        # engines.sgd_update_cycles)


@dataclass
class BoardStats:
    """Time breakdown and memory of one board over the whole simulation."""

    name: str
    device: int
    clock_hz: float
    busy_s: float
    bubble_s: float
    stall_s: float
    makespan_s: float
    peak_memory_bytes: int
    peak_onchip_bytes: int
    peak_offchip_bytes: int
    peak_buffer_bytes: int

    @property
    def busy(self) -> float:
        """Fraction of the makespan spent computing."""
        return self.busy_s / self.makespan_s if self.makespan_s else 0.0

    @property
    def bubble(self) -> float:
        """Fraction idle waiting for data (or for an all-reduce before the next iteration)."""
        return self.bubble_s / self.makespan_s if self.makespan_s else 0.0

    @property
    def stall(self) -> float:
        """Fraction idle because the output channel had no credits (back-pressure)."""
        return self.stall_s / self.makespan_s if self.makespan_s else 0.0

    def to_json(self) -> dict:
        """The ``--json`` record of this board."""
        return {"name": self.name, "device": self.device, "busy": self.busy, "bubble": self.bubble,
                "stall": self.stall, "busy_s": self.busy_s, "bubble_s": self.bubble_s, "stall_s": self.stall_s,
                "busy_cycles": round(self.busy_s * self.clock_hz), "clock_hz": self.clock_hz,
                "peak_memory_bytes": self.peak_memory_bytes, "peak_onchip_bytes": self.peak_onchip_bytes,
                "peak_offchip_bytes": self.peak_offchip_bytes, "peak_buffer_bytes": self.peak_buffer_bytes}


@dataclass
class LinkStats:
    """Use of one directed link."""

    name: str
    kind: str
    bandwidth_Bps: float
    busy_s: float
    bytes: int
    transfers: int
    utilisation: float

    def to_json(self) -> dict:
        """The ``--json`` record of this link."""
        return {"name": self.name, "kind": self.kind, "utilisation": self.utilisation, "busy_s": self.busy_s,
                "bytes": self.bytes, "transfers": self.transfers}


@dataclass
class SimResult:
    """Everything one simulation measured.

    ``ops``: (device, kind, microbatch, chunk, start_s, end_s); ``transfers``: (link name,
    start_s, end_s, label); ``stalls``: (device, start_s, end_s); ``allreduces``: (stage
    index, iteration, start_s, end_s); ``memory``: per device a list of (time_s, bytes) steps.
    """

    plan_model: str
    plan_cluster: str
    schedule: str
    mode: str
    devices: int
    chunks: int
    microbatches: int
    iterations: int
    samples_per_iteration: int
    makespan_s: float
    iteration_time_s: float
    iteration_ends_s: list[float]
    bubble_fraction: float
    bubble_ratio: float
    boards: list[BoardStats]
    links: list[LinkStats]
    device_boards: list[list[str]]
    events: int
    wall_s: float
    ops: list[tuple] = field(default_factory=list, repr=False)
    transfers: list[tuple] = field(default_factory=list, repr=False)
    stalls: list[tuple] = field(default_factory=list, repr=False)
    allreduces: list[tuple] = field(default_factory=list, repr=False)
    memory: list[list[tuple[float, int]]] = field(default_factory=list, repr=False)
    reference_clock_hz: float = 0.0
    stage_boards: dict[int, list[str]] = field(default_factory=dict, repr=False)

    @property
    def throughput_samples_per_s(self) -> float:
        """Training (or inference) samples per second in the simulated run."""
        return self.samples_per_iteration / self.iteration_time_s if self.iteration_time_s else 0.0

    @property
    def bubble_busiest(self) -> float:
        """The one bubble every command prints (docs/simulator.md): the idle share of the
        busiest board's time, 1 - max(busy_d) / makespan, as `bapipe plan` predicts it;
        ``bubble_fraction`` is the mean over boards."""
        return max(0.0, 1.0 - max(b.busy for b in self.boards)) if self.boards else self.bubble_fraction

    @property
    def steady_iteration_s(self) -> float:
        """Time between the ends of successive iterations (mean; makespan when there is one)."""
        e = self.iteration_ends_s
        return (e[-1] - e[0]) / (len(e) - 1) if len(e) > 1 else self.makespan_s

    def to_json(self) -> dict:
        """The ``bapipe sim --json`` object."""
        return {
            "model": self.plan_model, "cluster": self.plan_cluster, "schedule": self.schedule, "mode": self.mode,
            "devices": self.devices, "chunks": self.chunks, "microbatches": self.microbatches,
            "iterations": self.iterations,
            "iteration_time_s": self.iteration_time_s,
            "iteration_cycles": round(self.iteration_time_s * self.reference_clock_hz),
            "steady_iteration_s": self.steady_iteration_s, "makespan_s": self.makespan_s,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "bubble_fraction": self.bubble_fraction, "bubble_ratio": self.bubble_ratio,
            "boards": [b.to_json() for b in self.boards],
            "links": [ln.to_json() for ln in self.links],
            "events": self.events, "wall_s": self.wall_s,
            "events_per_s": self.events / self.wall_s if self.wall_s > 0 else None,
        }


def op_seconds(stage, kind: str) -> float:
    """Compute time of one op of ``stage`` for one micro-batch.

    The plan's ``fwd_s``/``bwd_s`` are per micro-batch on one replica: each of the r
    replicas computes its 1/r share of the micro-batch in that time, in lock-step. (A W
    op, never produced from a plan's single ``bwd_s``, takes no time of its own.)
    """
    if kind == "F":
        return stage.fwd_s
    if kind == "B":
        return stage.bwd_s
    return 0.0


def stash_peak_bytes(schedule: str, p: int, d: int, m: int, v: int, stash_bytes_by_chunk: list[float]) -> float:
    """Exact peak of live activation stashes on device ``d`` when chunk c stashes
    ``stash_bytes_by_chunk[c]`` per micro-batch: max over the op order of sum_c live_c x bytes_c.

    With one chunk this is ``stash_count x bytes``; with interleaving the chunks peak at
    different times and neither ``stash_count`` nor ceil(stash_count / v) per chunk gives it
    (what the simulator measures, for the planner's memory model).
    """
    live = [0] * v
    last = {}
    ops = device_ops(schedule, p, d, m, v)
    for i, o in enumerate(ops):
        if o.kind != "F":
            last[(o.mb, o.chunk)] = i
    cur = best = 0.0
    for i, o in enumerate(ops):
        if o.kind == "F":
            live[o.chunk] += 1
            cur += stash_bytes_by_chunk[o.chunk]
            best = max(best, cur)
        elif last.get((o.mb, o.chunk)) == i:
            live[o.chunk] -= 1
            cur -= stash_bytes_by_chunk[o.chunk]
    return best


def _bytes_per_element(fmt: str) -> int:
    from .boards import bytes_per_element
    return bytes_per_element(fmt)


def _input_bytes(model, fmt: str) -> int:
    """Bytes of one sample of the model's inputs (token ids as 4-byte integers)."""
    total = 0
    bpe = _bytes_per_element(fmt)
    for inp in model.inputs:
        total += math.prod(inp.shape) * (4 if getattr(inp, "dtype", "float") == "int" else bpe)
    return total


class _Net:
    """Directed links of the cluster (plus per-board PCIe to its host) with reservation."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.ids: dict[tuple[str, str], int] = {}
        self.names: list[str] = []
        self.kinds: list[str] = []
        self.bw: list[float] = []
        self.lat: list[float] = []
        self.free: list[float] = []
        self.busy: list[float] = []
        self.nbytes: list[int] = []
        self.count: list[int] = []

    def _link(self, a: str, b: str, bw: float, lat: float, kind: str) -> int:
        key = (a, b)
        i = self.ids.get(key)
        if i is None:
            i = len(self.names)
            self.ids[key] = i
            self.names.append(f"{a}->{b}")
            self.kinds.append(kind)
            self.bw.append(bw)
            self.lat.append(lat)
            self.free.append(0.0)
            self.busy.append(0.0)
            self.nbytes.append(0)
            self.count.append(0)
        return i

    def path(self, a: str, b: str) -> tuple[tuple[int, ...], float, float]:
        """(directed link ids, slowest bandwidth, total latency) from board a to board b
        (the route, its bandwidth and latency: ``Cluster.path``)."""
        hops, bw, lat = self.cluster.path(a, b)
        return tuple(self._link(u, v, ln.bandwidth_Bps, ln.latency_s, ln.kind) for u, v, ln in hops), bw, lat

    def pcie(self, board: str, to_board: bool) -> tuple[tuple[int, ...], float, float]:
        """The PCIe path between a board and its host, in either direction."""
        h = self.cluster.host_of(board)
        a, b = (h.name, board) if to_board else (board, h.name)
        i = self._link(a, b, h.pcie_bw_Bps, h.pcie_latency_s, "pcie")
        return (i,), self.bw[i], self.lat[i]


class _Channel:
    """One logical stream of messages (one per micro-batch) between two engines."""

    __slots__ = ("src", "dst", "credits", "queue", "arrived", "pieces", "credit_lat", "msg_bytes",
                 "label", "blocked", "inflight", "peak_inflight")

    def __init__(self, src: int, dst: int, credits: int, pieces, credit_lat: float, msg_bytes: int, label: str):
        self.src, self.dst = src, dst               # device ids; -1 is the host
        self.credits = credits
        self.queue: deque = deque()                 # finished outputs waiting for a credit
        self.arrived: set = set()                   # micro-batches in the receive buffer
        self.pieces = pieces                        # [(link ids, seconds on the wire, latency, bytes)]
        self.credit_lat = credit_lat
        self.msg_bytes = msg_bytes
        self.label = label
        self.blocked = False                        # the sender engine waits for a transmit slot
        self.inflight = 0                           # messages holding a receive-buffer slot
        self.peak_inflight = 0


@dataclass
class _Pipeline:
    """The plan's pipeline as the replay walks it: its stages by index, p devices x v chunks."""

    stages: list
    p: int                          # pipeline positions (devices)
    v: int                          # chunks per device (interleaved), else 1
    m: int                          # micro-batches per iteration
    iterations: int
    train: bool
    sched: str
    by_dc: dict[tuple[int, int], int]   # (device, chunk) -> position in ``stages``
    dev_boards: list[list[str]]     # per device: the boards that work in lock-step on it
    mbs: int                        # samples per micro-batch
    samples: int                    # per iteration, over all replicas

    @property
    def pd(self) -> bool:
        """Asynchronous PipeDream: per-micro-batch all-reduce, no iteration gate."""
        return self.train and self.sched == "pipedream"


def _pipeline(plan, iterations: int, cfg: SimConfig) -> _Pipeline:
    """Check the plan and the knobs can be replayed (one stage per device and chunk, boards on
    every device) and return its pipeline; every problem is a SpecError."""
    if iterations < 1:
        raise SpecError(None, None, "iterations", f"expected at least 1, got {iterations}")
    if (cfg.rx_credits is not None and cfg.rx_credits < 1) or cfg.tx_slots < 1:
        raise SpecError(None, None, "rx_credits", "expected at least one receive credit and one transmit slot")
    stages = sorted(plan.stages, key=lambda s: s.index)
    if not stages:
        raise SpecError(None, None, "stages", "expected at least one stage")
    devs = sorted({s.device for s in stages})
    if devs != list(range(len(devs))):
        raise SpecError(None, None, "stages.device", f"expected pipeline positions 0..{len(devs) - 1}, got {devs}")
    p = len(devs)
    sched = plan.schedule
    v = plan.chunks if sched == "interleaved" else 1
    by_dc = {}
    for k, s in enumerate(stages):
        if (s.device, s.chunk) in by_dc:
            raise SpecError(None, None, f"stages[{s.index}].chunk", f"device {s.device} already has chunk {s.chunk}")
        by_dc[(s.device, s.chunk)] = k
    for d in range(p):
        for c in range(v):
            if (d, c) not in by_dc:
                raise SpecError(None, None, "stages", f"no stage for device {d} chunk {c} ({sched}, v={v})")
    dev_boards: list[list[str]] = [[] for _ in range(p)]
    for s in stages:
        for b in s.boards:
            if b not in dev_boards[s.device]:
                dev_boards[s.device].append(b)
    if any(not bl for bl in dev_boards):
        raise SpecError(None, None, "stages.boards", "every stage needs at least one board")
    m = plan.microbatches
    mbs = max(1, plan.microbatch_size)
    return _Pipeline(stages=stages, p=p, v=v, m=m, iterations=iterations, train=plan.mode == "train", sched=sched,
                     by_dc=by_dc, dev_boards=dev_boards, mbs=mbs, samples=max(plan.global_batch, m * mbs))


# --- channels ------------------------------------------------------------------------------
# a piece of a message is (directed link ids, seconds on the wire, latency, bytes)

def _credits_for(cfg: SimConfig, nbytes: int, pieces, rate_s: float) -> int:
    """Receive slots of a channel: fixed by the config, or (auto) the fewest that cover the
    credit round trip (wire time + latency there and back) at one message per ``rate_s``,
    as a designer sizes a FIFO to the bandwidth-delay product; at least 2 (double buffer)."""
    if cfg.rx_buffer_bytes is not None and nbytes > 0:
        return max(1, cfg.rx_buffer_bytes // nbytes)
    if cfg.rx_credits is not None:
        return cfg.rx_credits
    loop = max((pc[1] + 2 * pc[2] for pc in pieces), default=0.0)
    if rate_s <= 0:
        return 2 if loop <= 0 else 1 << 20
    return max(2, math.ceil(loop / rate_s) + 1)


def _replica_leads(s) -> list[str]:
    """The first board of each replica of stage ``s`` (a replica's mesh moves as one)."""
    size = max(1, math.prod(s.mesh)) if s.mesh else 1
    r = max(1, s.replicas)
    return [s.boards[min(i * size, len(s.boards) - 1)] for i in range(r)]


def _stage_pieces(net: _Net, bpe: int, a, b, nbytes: int, holders: int | None = None, samples: int = 1):
    """Each replica of ``a`` sends its ``nbytes`` (its share of the micro-batch, ``samples``
    samples); with r_a == r_b replica i talks to replica i; otherwise the r_a x nbytes are
    spread over max(r_a, r_b) pieces, piece i from replica i mod r_a to replica i mod r_b.
    ``holders``: how many replicas ``nbytes`` is the share of (a gradient going back is
    the activation's tensor: the forward sender's replica count), default r_a. Between FPGAs
    a piece holds its route for its framed line bytes and arrives the framing's latency
    later (fpga_models.engines.link_transfer, as the planner prices it)."""
    cluster = net.cluster
    ra, rb = _replica_leads(a), _replica_leads(b)
    n = max(len(ra), len(rb))
    out = []
    frac = (holders or len(ra)) / n
    share = nbytes * frac
    for i in range(n):
        x, y = ra[i % len(ra)], rb[i % len(rb)]
        ids, bw, lat = net.path(x, y)
        line, extra = link_transfer(nbytes, bpe, samples, bw, link_clock(cluster.board(x).board,
                                                                          cluster.board(y).board))
        out.append((ids, line * frac / bw if ids else 0.0, lat + (extra if ids else 0.0), share))
    return out


def _mesh_pieces(net: _Net, src, dst, cut):
    """A resharding between meshes (``cut``: the stage whose output crosses), replayed as
    the planner priced it (``cut.send_s``, the best transfer of planner.reshard): one timed
    transfer holding every link on the routes between the two meshes' boards."""
    ids = sorted({i for x in src.boards for y in dst.boards if x != y for i in net.path(x, y)[0]})
    return [(tuple(ids), cut.send_s, 0.0, int(cut.send_bytes))]


def _is_mesh_cut(a, b) -> bool:
    return a.layout is not None and (math.prod(a.mesh or [1]) > 1 or math.prod(b.mesh or [1]) > 1)


def _host_pieces(net: _Net, pipe: _Pipeline, st, per_sample: int, to_board: bool):
    """Every replica of the first (last) stage reads (writes) its share over its own PCIe."""
    leads = _replica_leads(st)
    nb = per_sample * pipe.samples / (pipe.m * len(leads))
    out = []
    for b in leads:
        ids, bw, lat = net.pcie(b, to_board)
        out.append((ids, nb / bw, lat, nb))
    return out, int(nb)


@dataclass
class _Wiring:
    """The channels and, per stage, the channel feeding (leaving) its forward and backward; -1: none."""

    channels: list[_Channel]
    fwd_in: list[int]
    bwd_in: list[int]
    fwd_out: list[int]
    bwd_out: list[int]

    def add(self, cfg: SimConfig, src: int, dst: int, pieces, msg_bytes: int, label: str, rate_s: float) -> int:
        """A new channel from ``src`` to ``dst`` (devices; -1 the host); its index."""
        credit_lat = max((pc[2] for pc in pieces), default=0.0)
        self.channels.append(_Channel(src, dst, _credits_for(cfg, msg_bytes, pieces, rate_s), pieces, credit_lat,
                                      msg_bytes, label))
        return len(self.channels) - 1


def _wire(plan, model, pipe: _Pipeline, cfg: SimConfig, net: _Net) -> _Wiring:
    """Activations forward and gradients back between consecutive stages, plus the host's input
    (and, inference, output) over PCIe."""
    stages, S, train = pipe.stages, len(pipe.stages), pipe.train
    bpe = _bytes_per_element(plan.number_format)
    w = _Wiring([], [-1] * S, [-1] * S, [-1] * S, [-1] * S)
    for k in range(S - 1):
        a, b = stages[k], stages[k + 1]
        nb = int(a.send_bytes)
        mesh_cut = _is_mesh_cut(a, b)
        smp = -(-pipe.mbs // max(1, a.replicas))    # samples per replica per micro-batch (planner: beta_at)
        pcs = _mesh_pieces(net, a, b, a) if mesh_cut else _stage_pieces(net, bpe, a, b, nb, samples=smp)
        c = w.add(cfg, a.device, b.device, pcs, nb, f"act {a.index}->{b.index}", b.fwd_s)
        w.fwd_out[k], w.fwd_in[k + 1] = c, c
        if train:
            pcs = (_mesh_pieces(net, b, a, a) if mesh_cut
                   else _stage_pieces(net, bpe, b, a, nb, len(_replica_leads(a)), smp))
            c = w.add(cfg, b.device, a.device, pcs, nb, f"grad {b.index}->{a.index}", a.bwd_s)
            w.bwd_out[k + 1], w.bwd_in[k] = c, c
    if cfg.host_io:
        pcs, nb = _host_pieces(net, pipe, stages[0], _input_bytes(model, plan.number_format), True)
        w.fwd_in[0] = w.add(cfg, -1, stages[0].device, pcs, nb, "host input", stages[0].fwd_s)
        if not train:
            pcs, nb = _host_pieces(net, pipe, stages[-1],
                                   model.layers[-1].out_elems * _bytes_per_element(plan.number_format), False)
            w.fwd_out[S - 1] = w.add(cfg, stages[-1].device, -1, pcs, nb, "host output", stages[-1].fwd_s)
    return w


# --- op lists per device -------------------------------------------------------------------

@dataclass
class _OpTable:
    """Every device's ops in order as parallel lists (``kind[d][i]`` ... ``argate[d][i]``):
    what the event loop indexes."""

    kind: list[list[int]] = field(default_factory=list)     # _KIND_CODE
    mb: list[list[int]] = field(default_factory=list)
    chunk: list[list[int]] = field(default_factory=list)
    stage: list[list[int]] = field(default_factory=list)    # position in the pipeline's stages
    dur: list[list[float]] = field(default_factory=list)
    cin: list[list[int]] = field(default_factory=list)      # channel of the op's input, or -1
    cout: list[list[int]] = field(default_factory=list)     # channel of the op's output, or -1
    free: list[list[bool]] = field(default_factory=list)    # the op frees its micro-batch's stash
    iter_end: list[list[int]] = field(default_factory=list)  # iteration the op ends for its chunk, or -1
    gate: list[list[int]] = field(default_factory=list)     # iteration whose end must come first, or -1
    argate: list[list[int]] = field(default_factory=list)   # PipeDream: micro-batch whose ring must end first, or -1

    def rows(self) -> tuple[list, ...]:
        """The per-device lists, in field order."""
        return (self.kind, self.mb, self.chunk, self.stage, self.dur, self.cin, self.cout, self.free, self.iter_end,
                self.gate, self.argate)


def _op_sequence(pipe: _Pipeline, d: int) -> list[tuple]:
    """Device d's ops over all iterations, each with its iteration: (op, j)."""
    p, m, v, N, sched = pipe.p, pipe.m, pipe.v, pipe.iterations, pipe.sched
    if not pipe.train:
        return [(o, 0) for o in device_ops(sched, p, d, m * N, v, forward_only=True)]
    if sched in ASYNC or v == 1:
        return stream_ops(sched, p, d, m, N)
    seq = []
    base = device_ops(sched, p, d, m, v)
    for j in range(N):
        seq += [(type(o)(o.kind, o.mb + j * m, o.chunk), j) for o in base]
    return seq


def _sequence_marks(pipe: _Pipeline, seq: list[tuple]) -> tuple[dict, dict, dict]:
    """Positions in ``seq``: the last backward of each (micro-batch, chunk) (it frees the stash),
    the last backward of each (chunk, iteration) (it ends the iteration), and the first op of
    each iteration with the iteration that must have ended before it starts (flush: j - 1;
    2BW: j - 2; asynchronous PipeDream: none)."""
    last_bwd = {}
    for i, (o, j) in enumerate(seq):
        if o.kind != "F":
            last_bwd[(o.mb, o.chunk)] = i
    last_of_iter = {}
    for i, (o, j) in enumerate(seq):
        if pipe.train and o.kind != "F":
            last_of_iter[(o.chunk, j)] = i
    first_of_iter = {}
    for i, (o, j) in enumerate(seq):
        first_of_iter.setdefault(j, i)
    gate_at = {}
    if pipe.train and not pipe.pd:
        for j, i in first_of_iter.items():
            need = j - 2 if pipe.sched == "2bw" else j - 1
            if need >= 0:
                gate_at[i] = need
    return last_bwd, last_of_iter, gate_at


def _device_rows(pipe: _Pipeline, w: _Wiring, cfg: SimConfig, d: int, ar_gate: int) -> tuple[list, ...]:
    """Device d's ops in order, one list per field of :class:`_OpTable`."""
    seq = _op_sequence(pipe, d)
    last_bwd, last_of_iter, gate_at = _sequence_marks(pipe, seq)
    row = tuple([] for _ in range(11))
    kinds, mbl, chl, stl, dur, cin, cout, free, iend, gate, argate = row
    for i, (o, j) in enumerate(seq):
        k = pipe.by_dc[(d, o.chunk)]
        st = pipe.stages[k]
        kinds.append(_KIND_CODE[o.kind])
        mbl.append(o.mb)
        chl.append(o.chunk)
        stl.append(k)
        dur.append(op_seconds(st, o.kind))
        if o.kind == "F":
            cin.append(w.fwd_in[k])
            cout.append(w.fwd_out[k])
            free.append(False)
        else:
            cin.append(w.bwd_in[k] if o.kind == "B" else -1)
            cout.append(w.bwd_out[k] if o.kind == "B" else -1)
            free.append(last_bwd.get((o.mb, o.chunk)) == i)
        iend.append(j if (pipe.train and last_of_iter.get((o.chunk, j)) == i) else -1)
        gate.append(gate_at.get(i, -1))
        rep_ring = pipe.pd and cfg.allreduce and st.replicas > 1
        argate.append(o.mb - ar_gate if rep_ring and o.kind == "B" and o.mb >= ar_gate else -1)
    return row


def _op_table(pipe: _Pipeline, w: _Wiring, cfg: SimConfig) -> _OpTable:
    """Each device's op order (``bapipe.schedules``) with every op's duration, channels,
    stash release, iteration end and gates."""
    if pipe.sched == "interleaved" and pipe.m % pipe.p:
        raise SpecError(None, None, "microbatches",
                        f"interleaved needs a multiple of {pipe.p} micro-batches, got {pipe.m}")
    ar_gate = allreduce_gate(pipe.sched) if pipe.pd else 0
    table = _OpTable()
    for d in range(pipe.p):
        for lst, val in zip(table.rows(), _device_rows(pipe, w, cfg, d, ar_gate)):
            lst.append(val)
    return table


# --- all-reduce rings ----------------------------------------------------------------------

@dataclass
class _Rings:
    """Per stage None or (pieces per replica step i -> i+1, steps, replicas); with
    ``per_device`` only a device's first stage (``dev_rep``) carries the device's ring."""

    rings: list
    per_device: bool
    dev_rep: dict[int, int]     # device -> its first stage
    tails: list = field(default_factory=list)   # per stage None or fpga_models.update.Tail (flush, ring, update)


def _rings(plan, model, cluster, pipe: _Pipeline, cfg: SimConfig, net: _Net) -> _Rings:
    """The ring all-reduce of every replicated stage (training), hop by hop between replica leads."""
    bpe = _bytes_per_element(plan.number_format)
    if cfg.allreduce_per not in ("stage", "device"):
        raise SpecError(None, None, "allreduce_per", f"expected 'stage' or 'device', got {cfg.allreduce_per!r}")
    per_device = cfg.allreduce_per == "device"
    stages = pipe.stages
    dev_rep = {}
    for k, st in enumerate(stages):
        dev_rep.setdefault(st.device, k)

    def grad_bytes(st) -> float:
        # the plan's weight bytes are the gradient bytes (same format); else count the params
        return st.weight_bytes or sum(l.weight_params for l in model.layers[st.first:st.last + 1]) * bpe

    tails = [_tail(plan, model, cluster, st, net) if pipe.train and cfg.kernel_tails else None for st in stages]
    rings = []
    for k, st in enumerate(stages):
        r = max(1, st.replicas)
        if not (pipe.train and cfg.allreduce and r > 1) or (per_device and dev_rep[st.device] != k):
            rings.append(None)
            continue
        grad = sum(grad_bytes(x) for x in stages if x.device == st.device) if per_device else grad_bytes(st)
        share = ring_share(grad, r)
        leads = _replica_leads(st)
        hops = []
        for i in range(r):
            ids, bw, lat = net.path(leads[i], leads[(i + 1) % r])
            if tails[k] is not None and not per_device:   # the HLS kernel's ring: every hop at the slowest one's pace
                hops.append((ids, tails[k].ring_occ_s if ids else 0.0, tails[k].ring_lat_s, share))
                continue
            # between FPGAs the step carries the exact gradient sums, framed (collective.ring_hop_s)
            # synchronous schedules only: the asynchronous ones' per-micro-batch rings (not built
            # in RTL) still move the weight bytes, as the planner prices them
            clk = None if plan.schedule in ("pipedream", "2bw") else link_clock(
                cluster.board(leads[i]).board, cluster.board(leads[(i + 1) % r]).board)
            occ, lat = ring_hop_s(grad, bpe, r, bw, lat, clk)
            hops.append((ids, occ if ids else 0.0, lat, share))
        rings.append((hops, ring_steps(r), r))
    return _Rings(rings, per_device, dev_rep, tails)


def _tail(plan, model, cluster, st, net: _Net):
    """Stage ``st``'s per-iteration tail as the HLS kernels build it (fpga_models.update.stage_tail,
    the planner's Explorer.stage_tails) when the plan prices one (its ``flush_s`` / ``update_s``):
    training FPGA stages of synchronous schedules, one board a replica; None otherwise (nothing
    after the last backward but the ring)."""
    from .update import engine_kernel, stage_tail

    if not (st.flush_s or st.update_s):   # the plan prices no tail (e.g. stage times given by hand)
        return None
    if plan.schedule in ASYNC or (st.mesh and math.prod(st.mesh) > 1):
        return None
    board = cluster.board(st.boards[0]).board
    if board.kind != "fpga":
        return None
    r = max(1, st.replicas)
    hop = None
    if r > 1:
        leads = _replica_leads(st)
        bw, lat = math.inf, 0.0
        for i in range(r):
            _ids, b, lt = net.path(leads[i], leads[(i + 1) % r])
            bw, lat = min(bw, b), max(lat, lt)
        hop = (bw, lat)
    fold = {n: ((f.pe, f.simd) if f.lanes is None else (1, 1)) for n, f in st.folding.items()}
    # the flush as the plan priced it: its backward engines' (fpga_models.bwd_memory.bwd_flush_cycles)
    return stage_tail(model, st.first, st.last, board, _bytes_per_element(plan.number_format), r,
                      engine_kernel(model, st.first, st.last), fold, hop, flush=st.flush_s * board.clock_hz)


def _static_memory(pipe: _Pipeline) -> tuple[list[int], list[float]]:
    """Per device its static bytes (weights x copies, optimizer state, line buffers: what the
    plan's memory_bytes holds beyond its stashes) and per stage the stash bytes of one
    micro-batch (stash_bytes covers ``stashes`` micro-batches; none in inference)."""
    weights = [0] * pipe.p
    for st in pipe.stages:
        static = st.memory_bytes - st.stash_bytes if st.memory_bytes >= st.stash_bytes + st.weight_bytes else 0
        weights[st.device] += int(max(static, st.weight_bytes))
    stash = [(st.stash_bytes / st.stashes if st.stashes > 0 else st.stash_bytes) if pipe.train else 0
             for st in pipe.stages]
    return weights, stash


# --- the event replay ----------------------------------------------------------------------

class _Replay:
    """The discrete-event replay of one plan: a compute engine per device runs its op list in
    order; channels carry micro-batches under credits; rings all-reduce replicated stages;
    stash memory is tracked per device. ``start`` then ``run`` drain the event heap."""

    def __init__(self, pipe: _Pipeline, cfg: SimConfig, w: _Wiring, ops: _OpTable, rings: _Rings, net: _Net):
        p, stages = pipe.p, pipe.stages
        self.pipe, self.cfg, self.net = pipe, cfg, net
        self.stages, self.S, self.m, self.N = stages, len(stages), pipe.m, pipe.iterations
        self.train, self.pd = pipe.train, pipe.pd
        self.channels, self.fwd_in = w.channels, w.fwd_in
        self.rings, self.per_device, self.dev_rep = rings.rings, rings.per_device, rings.dev_rep
        self.tails = rings.tails or [None] * len(stages)
        self.record, self.tx_slots = cfg.record, cfg.tx_slots
        # iterations: per (stage, iteration) replicas still in the ring; per device and iteration stages left
        self.ar_left: dict[tuple[int, int], int] = {}
        self.ar_start: dict[tuple[int, int], float] = {}
        self.dev_stages = [sum(1 for s in stages if s.device == d) for d in range(p)]
        self.dev_iter_left: dict[tuple[int, int], int] = {}
        self.dev_bwd_left: dict[tuple[int, int], int] = {}
        self.dev_stage_ids = [[k for k, s in enumerate(stages) if s.device == d] for d in range(p)]
        self.dev_iter_done: dict[tuple[int, int], float] = {}
        self.iter_end = [0.0] * self.N
        self.ar_done_mb: set = set()                     # PipeDream: (stage, micro-batch) all-reduced
        self.pd_left: dict[tuple[int, int], int] = {}    # PipeDream: (stage, iteration) rings + last B pending
        # memory
        weights, self.stash = _static_memory(pipe)
        self.live = weights[:]
        self.peak = weights[:]
        self.mem_tl: list[list[tuple[float, int]]] = [[(0.0, x)] for x in weights]
        # engines
        self.idx = [0] * p
        self.nops = [len(x) for x in ops.kind]
        (self.op_kind, self.op_mb, self.op_chunk, self.op_stage, self.op_dur, self.op_cin, self.op_cout, self.op_free,
         self.op_iter_end, self.op_gate, self.op_argate) = ops.rows()
        self.busy_flag = [False] * p
        self.busy_s = [0.0] * p
        self.stall_s = [0.0] * p
        self.wait_kind = [0] * p      # 0 not waiting, 1 bubble (input / gate), 2 stall (no transmit slot)
        self.wait_since = [0.0] * p
        self.cur_start = [0.0] * p
        self.heap: list = []
        self.seq = itertools.count(1)   # ties in time go in push order
        self.n_events = 0
        self.rec_ops: list[tuple] = []
        self.rec_tx: list[tuple] = []
        self.rec_stall: list[tuple] = []
        self.rec_ar: list[tuple] = []

    # links and channels
    def reserve(self, pieces, now: float, label) -> float:
        """Reserve each piece's route; return when the last piece has arrived."""
        net, record = self.net, self.record
        arrive = now
        for ids, wire, lat, nb in pieces:
            start = hold(net.free, ids, now, wire)   # the planner's replay holds links the same way
            end = start + wire
            for i in ids:
                net.busy[i] += wire
                net.nbytes[i] += nb
                net.count[i] += 1
                if record:
                    self.rec_tx.append((net.names[i], start, end, label))
            if end + lat > arrive:
                arrive = end + lat
        return arrive

    def try_send(self, ci: int, now: float) -> None:
        """Send channel ci's waiting outputs while it has credits; unblock its sender."""
        ch = self.channels[ci]
        q = ch.queue
        while q and ch.credits > 0:
            mb = q.popleft()
            ch.credits -= 1
            ch.inflight += 1
            if ch.inflight > ch.peak_inflight:
                ch.peak_inflight = ch.inflight
            t = self.reserve(ch.pieces, now, mb)
            _push(self.heap, (t, next(self.seq), _ARRIVE, ci, mb))
        if ch.blocked and len(q) < self.tx_slots:
            ch.blocked = False
            self.try_start(ch.src, now)

    # engines
    def try_start(self, d: int, now: float) -> None:
        """Start device d's next op if nothing holds it, else note why it waits."""
        if self.busy_flag[d]:
            return
        i = self.idx[d]
        if i >= self.nops[d]:
            return
        reason = self.wait_reason(d, i)
        if reason:
            if self.wait_kind[d] != reason:
                if self.wait_kind[d] == 2:
                    self.end_stall(d, now)
                self.wait_kind[d] = reason
                self.wait_since[d] = now
            return
        self.start_op(d, i, now)

    def wait_reason(self, d: int, i: int) -> int:
        """0: device d's op i can start; 1: it waits for its input or a gate (bubble); 2: its
        output channel has no free transmit slot (stall; the channel is marked blocked)."""
        g = self.op_gate[d][i]
        ga = self.op_argate[d][i]
        if g >= 0 and (d, g) not in self.dev_iter_done:
            return 1
        if ga >= 0 and (self.op_stage[d][i], ga) not in self.ar_done_mb:
            return 1
        ci = self.op_cin[d][i]
        if ci >= 0 and self.op_mb[d][i] not in self.channels[ci].arrived:
            return 1
        co = self.op_cout[d][i]
        if co >= 0 and len(self.channels[co].queue) >= self.tx_slots:
            self.channels[co].blocked = True
            return 2
        return 0

    def end_stall(self, d: int, end: float) -> None:
        self.stall_s[d] += end - self.wait_since[d]
        if self.record:
            self.rec_stall.append((d, self.wait_since[d], end))

    def start_op(self, d: int, i: int, now: float) -> None:
        """Device d starts its op i: its input leaves the receive buffer (the credit goes back:
        at once to the host, else after the reverse path latency); a forward stashes."""
        if self.wait_kind[d] == 2:
            self.end_stall(d, now)
        self.wait_kind[d] = 0
        ci = self.op_cin[d][i]
        if ci >= 0:
            ch = self.channels[ci]
            ch.arrived.discard(self.op_mb[d][i])
            ch.inflight -= 1
            if ch.src < 0:
                ch.credits += 1
                self.try_send(ci, now)
            else:
                _push(self.heap, (now + ch.credit_lat, next(self.seq), _CREDIT, ci, 0))
        if self.op_kind[d][i] == 0 and self.stash[self.op_stage[d][i]]:
            self.stash_change(d, self.stash[self.op_stage[d][i]], now)
        self.busy_flag[d] = True
        self.cur_start[d] = now
        dt = self.op_dur[d][i]
        self.busy_s[d] += dt
        _push(self.heap, (now + dt, next(self.seq), _OP_DONE, d, 0))

    def stash_change(self, d: int, nbytes: float, now: float) -> None:
        """Device d's live stash grows by ``nbytes`` (a forward) or shrinks (its last backward)."""
        self.live[d] += nbytes
        if self.live[d] > self.peak[d]:
            self.peak[d] = self.live[d]
        if self.record:
            self.mem_tl[d].append((now, self.live[d]))

    def on_done(self, d: int, now: float) -> None:
        """Device d's current op ended: record it, send its output, close its iteration, go on."""
        i = self.idx[d]
        self.busy_flag[d] = False
        kind = self.op_kind[d][i]
        mb = self.op_mb[d][i]
        k = self.op_stage[d][i]
        if self.record:
            self.rec_ops.append((d, KINDS[kind], mb, self.op_chunk[d][i], self.cur_start[d], now))
        if self.op_free[d][i] and self.stash[k]:
            self.stash_change(d, -self.stash[k], now)
        co = self.op_cout[d][i]
        self.idx[d] = i + 1
        if co >= 0:
            self.channels[co].queue.append(mb)
            self.try_send(co, now)
        m, iter_end = self.m, self.iter_end
        if not self.train and k == self.S - 1 and mb // m < self.N and now > iter_end[mb // m]:
            iter_end[mb // m] = now  # forward-only: an iteration ends when its last micro-batch leaves
        j = self.op_iter_end[d][i]
        if self.pd and kind == 1 and self.rings[k] is not None:
            self.start_allreduce(k, ("mb", mb), now)   # after the gradient has left
        if j >= 0:
            self.last_backward(d, k, j, now)
        self.try_start(d, now)

    # iterations and all-reduce
    def last_backward(self, d: int, k: int, j: int, now: float) -> None:
        """Stage k (on device d) ran its last backward of iteration j: reduce, or be done."""
        rings = self.rings
        if self.pd and rings[k] is not None:
            self.pd_step(k, j, now)
        elif self.per_device:
            key = (d, j)
            left = self.dev_bwd_left.get(key, self.dev_stages[d]) - 1
            self.dev_bwd_left[key] = left
            if left == 0:
                kr = self.dev_rep[d]
                ts = [self.tails[kk] for kk in self.dev_stage_ids[d] if self.tails[kk] is not None]
                flush, update = sum(t.flush_s for t in ts), sum(t.update_s for t in ts)
                if rings[kr] is not None and flush:   # the device's flushes, then its ring
                    _push(self.heap, (now + flush, next(self.seq), _TAIL, ("ring", kr, j), 0))
                elif rings[kr] is not None:
                    self.start_allreduce(kr, j, now)
                elif flush or update:
                    _push(self.heap, (now + flush + update, next(self.seq), _TAIL, ("device", d, j), 0))
                else:
                    for kk in self.dev_stage_ids[d]:
                        self.stage_done(kk, j, now)
        elif self.tails[k] is not None:   # the flush, then the ring (or the update at once)
            t = self.tails[k]
            if rings[k] is not None:
                _push(self.heap, (now + t.flush_s, next(self.seq), _TAIL, ("ring", k, j), 0))
            else:
                _push(self.heap, (now + t.flush_s + t.update_s, next(self.seq), _TAIL, ("done", k, j), 0))
        elif rings[k] is not None:
            self.start_allreduce(k, j, now)
        else:
            self.stage_done(k, j, now)

    def stage_done(self, k: int, j: int, now: float) -> None:
        """Stage k finished iteration j (last backward, plus its all-reduce)."""
        d = self.stages[k].device
        key = (d, j)
        left = self.dev_iter_left.get(key, self.dev_stages[d]) - 1
        self.dev_iter_left[key] = left
        if now > self.iter_end[j]:
            self.iter_end[j] = now
        if left == 0:
            self.dev_iter_done[key] = now
            self.try_start(d, now)

    def pd_step(self, k: int, j: int, now: float) -> None:
        """PipeDream: one of stage k's pending events of iteration j (a micro-batch's ring or
        the iteration's last backward) is over; the stage is done with j after all of them."""
        key = (k, j)
        left = self.pd_left.get(key, self.m + 1) - 1
        self.pd_left[key] = left
        if left == 0:
            self.stage_done(k, j, now)

    def start_allreduce(self, k: int, j, now: float) -> None:
        hops, steps, r = self.rings[k]
        self.ar_left[(k, j)] = r
        self.ar_start[(k, j)] = now
        for i in range(r):
            t = self.reserve((hops[i],), now, f"allreduce s{k}")
            _push(self.heap, (t, next(self.seq), _AR_ARRIVE, (k, j, 0), (i + 1) % r))

    def ring_step(self, x: tuple, y: int, now: float) -> None:
        """Step ``x`` = (stage, iteration, step) of a ring arrived at replica y: forward it, or
        count the replica done with the ring."""
        k, j, step = x
        hops, steps, r = self.rings[k]
        if step + 1 < steps:
            t = self.reserve((hops[y],), now, f"allreduce s{k}")
            _push(self.heap, (t, next(self.seq), _AR_ARRIVE, (k, j, step + 1), (y + 1) % r))
            return
        self.ar_left[(k, j)] -= 1
        if self.ar_left[(k, j)] == 0:
            self.ring_done(k, j, now)

    def ring_done(self, k: int, j, now: float) -> None:
        stages, m = self.stages, self.m
        if isinstance(j, tuple):   # PipeDream: one micro-batch's ring
            mbk = j[1]
            self.ar_done_mb.add((k, mbk))
            if self.record:
                self.rec_ar.append((stages[k].index, mbk // m, self.ar_start[(k, j)], now))
            self.pd_step(k, mbk // m, now)
            self.try_start(stages[k].device, now)
            return
        if self.record:
            self.rec_ar.append((stages[k].index, j, self.ar_start[(k, j)], now))
        if not self.per_device and self.tails[k] is not None:   # the update kernel after the ring
            _push(self.heap, (now + self.tails[k].update_s, next(self.seq), _TAIL, ("done", k, j), 0))
            return
        if self.per_device:   # the device's update kernels after its ring
            d = stages[k].device
            update = sum(self.tails[kk].update_s for kk in self.dev_stage_ids[d] if self.tails[kk] is not None)
            if update:
                _push(self.heap, (now + update, next(self.seq), _TAIL, ("device", d, j), 0))
                return
        for kk in (self.dev_stage_ids[stages[k].device] if self.per_device else (k,)):
            self.stage_done(kk, j, now)

    def arrive(self, ci: int, mb: int, now: float) -> None:
        """Micro-batch mb arrived at the end of channel ci."""
        ch = self.channels[ci]
        if ch.dst < 0:          # the host drains its output at once
            ch.inflight -= 1
            ch.credits += 1
            self.try_send(ci, now)
            if not self.train:
                j = mb // self.m
                if now > self.iter_end[j]:
                    self.iter_end[j] = now
        else:
            ch.arrived.add(mb)
            self.try_start(ch.dst, now)

    # the run
    def start(self) -> None:
        """Time 0: every engine tries its first op; the host's input starts streaming."""
        p, cfg = self.pipe.p, self.cfg
        for d in range(p):
            self.try_start(d, 0.0)
        if cfg.host_io:
            # the host staged the first inputs during the previous iteration (a training loop
            # overlaps them), so they sit in the receive buffer at t=0; the rest stream over PCIe
            ci = self.fwd_in[0]
            ch = self.channels[ci]
            total = self.m * self.N
            first = min(ch.credits, total) if cfg.prefetch_input else 0
            ch.arrived.update(range(first))
            ch.credits -= first
            ch.inflight = ch.peak_inflight = first
            ch.queue.extend(range(first, total))
            self.try_send(ci, 0.0)
            for d in range(p):
                self.try_start(d, 0.0)

    def run(self) -> float:
        """Drain the event heap; the time of the last event."""
        heap, pop, channels = self.heap, heapq.heappop, self.channels
        on_done, arrive, try_send, ring_step = self.on_done, self.arrive, self.try_send, self.ring_step
        now = 0.0
        n = 0
        while heap:
            now, _, code, x, y = pop(heap)
            n += 1
            if code == _OP_DONE:
                on_done(x, now)
            elif code == _ARRIVE:
                arrive(x, y, now)
            elif code == _CREDIT:
                channels[x].credits += 1
                try_send(x, now)
            elif code == _AR_ARRIVE:  # all-reduce step arrived at replica y
                ring_step(x, y, now)
            else:  # a stage's tail: its flush ended (start the ring) or its update did
                what, k, j = x
                if what == "ring":
                    self.start_allreduce(k, j, now)
                elif what == "device":   # k: the device, all of whose stages are done
                    for kk in self.dev_stage_ids[k]:
                        self.stage_done(kk, j, now)
                else:
                    self.stage_done(k, j, now)
        self.n_events = n
        return now

    def finish(self, now: float) -> float:
        """Refuse a deadlock; the makespan, with waits still open at its end closed."""
        stuck = [d for d in range(self.pipe.p) if self.idx[d] < self.nops[d]]
        if stuck:
            d = stuck[0]
            i = self.idx[d]
            c = self.op_chunk[d][i]
            what = f"{KINDS[self.op_kind[d][i]]}{self.op_mb[d][i]}" + (f".{c}" if c else "")
            raise SpecError(None, None, "sim", f"deadlock at t={now:.6g} s: device {d} cannot start {what} "
                                               f"(rx_credits={self.cfg.rx_credits}, tx_slots={self.cfg.tx_slots}); "
                                               "expected larger receive buffers")
        # the run ends with the last iteration (last backward / all-reduce, or the last output at
        # the host), not with trailing bookkeeping such as credits flowing back
        makespan = max(self.iter_end) if max(self.iter_end) > 0 else now
        for d in range(self.pipe.p):  # close waits still open at the end (idle tails count as bubble)
            if self.wait_kind[d] == 2 and self.wait_since[d] < makespan:
                self.end_stall(d, makespan)
        return makespan


def _board_stats(cluster, rp: _Replay, makespan: float) -> list[BoardStats]:
    """Every board's time breakdown and memory (the boards of a device share its timeline)."""
    from .boards import on_chip_bytes
    p = rp.pipe.p
    boards_out: list[BoardStats] = []
    buf_bytes = [0] * p
    for ch in rp.channels:
        if ch.dst >= 0:
            buf_bytes[ch.dst] += ch.peak_inflight * ch.msg_bytes
    busy_s, stall_s, peak = rp.busy_s, rp.stall_s, rp.peak
    for d in range(p):
        for b in rp.pipe.dev_boards[d]:
            board = cluster.board(b).board
            cap = on_chip_bytes(board)
            boards_out.append(BoardStats(
                name=b, device=d, clock_hz=board.clock_hz, busy_s=busy_s[d], stall_s=stall_s[d],
                bubble_s=max(0.0, makespan - busy_s[d] - stall_s[d]), makespan_s=makespan,
                peak_memory_bytes=round(peak[d]), peak_onchip_bytes=round(min(peak[d], cap)),
                peak_offchip_bytes=round(max(0, peak[d] - cap)), peak_buffer_bytes=buf_bytes[d]))
    return boards_out


def _link_stats(net: _Net, makespan: float) -> list[LinkStats]:
    """Every directed link the replay used, in the order it first used it."""
    return [LinkStats(name=net.names[i], kind=net.kinds[i], bandwidth_Bps=net.bw[i], busy_s=net.busy[i],
                      bytes=int(round(net.nbytes[i])), transfers=net.count[i],
                      utilisation=net.busy[i] / makespan if makespan else 0.0)
            for i in range(len(net.names))]


def simulate(plan, model=None, cluster=None, iterations: int = 1, config: SimConfig | None = None) -> SimResult:
    """Simulate ``iterations`` training (or inference) iterations of ``plan``.

    ``model`` and ``cluster`` default to ``fpga_models.plancheck.resolve(plan)``. Raises SpecError
    when the plan cannot run (unknown boards, a deadlock from too few credits).
    """
    t_wall = time.perf_counter()
    cfg = config or SimConfig()
    if model is None or cluster is None:
        from bapipe.fpga_models.plancheck import resolve
        model, cluster = resolve(plan)
    pipe = _pipeline(plan, iterations, cfg)
    net = _Net(cluster)
    wiring = _wire(plan, model, pipe, cfg, net)
    ops = _op_table(pipe, wiring, cfg)
    rp = _Replay(pipe, cfg, wiring, ops, _rings(plan, model, cluster, pipe, cfg, net), net)
    rp.start()
    makespan = rp.finish(rp.run())
    p, N, busy_s = pipe.p, pipe.iterations, rp.busy_s
    total_busy = sum(busy_s)
    bubble_fraction = 1.0 - total_busy / (p * makespan) if makespan else 0.0
    bubble_ratio = (p * makespan - total_busy) / total_busy if total_busy else 0.0
    ref_clock = cluster.board(pipe.dev_boards[0][0]).board.clock_hz
    return SimResult(
        plan_model=plan.model, plan_cluster=plan.cluster, schedule=pipe.sched, mode=plan.mode, devices=p,
        chunks=pipe.v, microbatches=pipe.m, iterations=N, samples_per_iteration=pipe.samples, makespan_s=makespan,
        iteration_time_s=makespan / N, iteration_ends_s=list(rp.iter_end), bubble_fraction=bubble_fraction,
        bubble_ratio=bubble_ratio, boards=_board_stats(cluster, rp, makespan), links=_link_stats(net, makespan),
        device_boards=pipe.dev_boards, events=rp.n_events, wall_s=time.perf_counter() - t_wall, ops=rp.rec_ops,
        transfers=rp.rec_tx, stalls=rp.rec_stall, allreduces=rp.rec_ar, memory=rp.mem_tl, reference_clock_hz=ref_clock,
        stage_boards={s.index: list(s.boards) for s in pipe.stages})
