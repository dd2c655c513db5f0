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
_OP_DONE, _ARRIVE, _CREDIT, _AR_ARRIVE = 0, 1, 2, 3
KINDS = ("F", "B", "W")
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
    if iterations < 1:
        raise SpecError(None, None, "iterations", f"expected at least 1, got {iterations}")
    if (cfg.rx_credits is not None and cfg.rx_credits < 1) or cfg.tx_slots < 1:
        raise SpecError(None, None, "rx_credits", "expected at least one receive credit and one transmit slot")
    stages = sorted(plan.stages, key=lambda s: s.index)
    if not stages:
        raise SpecError(None, None, "stages", "expected at least one stage")
    S = len(stages)
    devs = sorted({s.device for s in stages})
    if devs != list(range(len(devs))):
        raise SpecError(None, None, "stages.device", f"expected pipeline positions 0..{len(devs) - 1}, got {devs}")
    p = len(devs)
    train = plan.mode == "train"
    sched = plan.schedule
    v = plan.chunks if sched == "interleaved" else 1
    m = plan.microbatches
    by_dc = {}
    for k, s in enumerate(stages):
        if (s.device, s.chunk) in by_dc:
            raise SpecError(None, None, f"stages[{s.index}].chunk", f"device {s.device} already has chunk {s.chunk}")
        by_dc[(s.device, s.chunk)] = k
    for d in range(p):
        for c in range(v):
            if (d, c) not in by_dc:
                raise SpecError(None, None, "stages", f"no stage for device {d} chunk {c} ({sched}, v={v})")

    # --- boards of each device ------------------------------------------------------
    dev_boards: list[list[str]] = [[] for _ in range(p)]
    for s in stages:
        for b in s.boards:
            if b not in dev_boards[s.device]:
                dev_boards[s.device].append(b)
    if any(not bl for bl in dev_boards):
        raise SpecError(None, None, "stages.boards", "every stage needs at least one board")

    # --- channels -------------------------------------------------------------------
    net = _Net(cluster)
    bpe = _bytes_per_element(plan.number_format)
    mbs = max(1, plan.microbatch_size)
    m = plan.microbatches
    samples = max(plan.global_batch, m * mbs)  # per iteration, over all replicas

    def credits_for(nbytes: int, pieces, rate_s: float) -> int:
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

    def replica_leads(s) -> list[str]:
        size = max(1, math.prod(s.mesh)) if s.mesh else 1
        r = max(1, s.replicas)
        return [s.boards[min(i * size, len(s.boards) - 1)] for i in range(r)]

    def stage_pieces(a, b, nbytes: int, holders: int | None = None, samples: int = 1):
        """Each replica of ``a`` sends its ``nbytes`` (its share of the micro-batch, ``samples``
        samples); with r_a == r_b replica i talks to replica i; otherwise the r_a x nbytes are
        spread over max(r_a, r_b) pieces, piece i from replica i mod r_a to replica i mod r_b.
        ``holders``: how many replicas ``nbytes`` is the share of (a gradient going back is
        the activation's tensor: the forward sender's replica count), default r_a. Between FPGAs
        a piece holds its route for its framed line bytes and arrives the framing's latency
        later (fpga_models.engines.link_transfer, as the planner prices it)."""
        ra, rb = replica_leads(a), replica_leads(b)
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

    channels: list[_Channel] = []
    fwd_in: list[int] = [-1] * S    # channel feeding stage k's forward
    bwd_in: list[int] = [-1] * S    # channel feeding stage k's backward
    fwd_out: list[int] = [-1] * S
    bwd_out: list[int] = [-1] * S

    def add(src, dst, pieces, msg_bytes, label, rate_s) -> int:
        credit_lat = max((pc[2] for pc in pieces), default=0.0)
        channels.append(_Channel(src, dst, credits_for(msg_bytes, pieces, rate_s), pieces, credit_lat, msg_bytes,
                                 label))
        return len(channels) - 1

    def mesh_pieces(src, dst, cut):
        """A resharding between meshes (``cut``: the stage whose output crosses), replayed as
        the planner priced it (``cut.send_s``, the best transfer of planner.reshard): one timed
        transfer holding every link on the routes between the two meshes' boards."""
        ids = sorted({i for x in src.boards for y in dst.boards if x != y for i in net.path(x, y)[0]})
        return [(tuple(ids), cut.send_s, 0.0, int(cut.send_bytes))]

    def is_mesh_cut(a, b) -> bool:
        return a.layout is not None and (math.prod(a.mesh or [1]) > 1 or math.prod(b.mesh or [1]) > 1)

    for k in range(S - 1):
        a, b = stages[k], stages[k + 1]
        nb = int(a.send_bytes)
        mesh_cut = is_mesh_cut(a, b)
        smp = -(-mbs // max(1, a.replicas))    # samples per replica per micro-batch (planner: beta_at)
        pcs = mesh_pieces(a, b, a) if mesh_cut else stage_pieces(a, b, nb, samples=smp)
        c = add(a.device, b.device, pcs, nb, f"act {a.index}->{b.index}", b.fwd_s)
        fwd_out[k], fwd_in[k + 1] = c, c
        if train:
            pcs = mesh_pieces(b, a, a) if mesh_cut else stage_pieces(b, a, nb, len(replica_leads(a)), smp)
            c = add(b.device, a.device, pcs, nb, f"grad {b.index}->{a.index}", a.bwd_s)
            bwd_out[k + 1], bwd_in[k] = c, c
    if cfg.host_io:
        # every replica of the first (last) stage reads (writes) its share over its own PCIe
        def host_pieces(st, per_sample: int, to_board: bool):
            leads = replica_leads(st)
            nb = per_sample * samples / (m * len(leads))
            out = []
            for b in leads:
                ids, bw, lat = net.pcie(b, to_board)
                out.append((ids, nb / bw, lat, nb))
            return out, int(nb)

        pcs, nb = host_pieces(stages[0], _input_bytes(model, plan.number_format), True)
        fwd_in[0] = add(-1, stages[0].device, pcs, nb, "host input", stages[0].fwd_s)
        if not train:
            pcs, nb = host_pieces(stages[-1], model.layers[-1].out_elems * _bytes_per_element(plan.number_format),
                                  False)
            fwd_out[S - 1] = add(stages[-1].device, -1, pcs, nb, "host output", stages[-1].fwd_s)

    # --- op lists per device ----------------------------------------------------------
    N = iterations
    two_bw = sched == "2bw"
    pd = train and sched == "pipedream"          # per-micro-batch all-reduce, no iteration gate
    ar_gate = allreduce_gate(sched) if pd else 0
    op_kind, op_mb, op_chunk, op_stage, op_dur, op_in, op_out, op_free, op_iter_end, op_gate = \
        ([] for _ in range(10))
    op_argate: list[list[int]] = []   # PipeDream: micro-batch whose all-reduce must end first, or -1
    if sched == "interleaved" and m % p:
        raise SpecError(None, None, "microbatches", f"interleaved needs a multiple of {p} micro-batches, got {m}")
    for d in range(p):
        if not train:
            seq = [(o, 0) for o in device_ops(sched, p, d, m * N, v, forward_only=True)]
        elif sched in ASYNC or v == 1:
            seq = stream_ops(sched, p, d, m, N)
        else:
            seq = []
            base = device_ops(sched, p, d, m, v)
            for j in range(N):
                seq += [(type(o)(o.kind, o.mb + j * m, o.chunk), j) for o in base]
        kinds, mbl, chl, stl, dur, cin, cout, free, iend, gate = ([] for _ in range(10))
        argate = []
        last_bwd = {}
        for i, (o, j) in enumerate(seq):
            if o.kind != "F":
                last_bwd[(o.mb, o.chunk)] = i
        last_of_iter = {}
        for i, (o, j) in enumerate(seq):
            if train and o.kind != "F":
                last_of_iter[(o.chunk, j)] = i
        first_of_iter = {}
        for i, (o, j) in enumerate(seq):
            first_of_iter.setdefault(j, i)
        gate_at = {}
        if train and not pd:
            for j, i in first_of_iter.items():
                need = j - 2 if two_bw else j - 1
                if need >= 0:
                    gate_at[i] = need
        for i, (o, j) in enumerate(seq):
            k = by_dc[(d, o.chunk)]
            st = stages[k]
            kinds.append(_KIND_CODE[o.kind])
            mbl.append(o.mb)
            chl.append(o.chunk)
            stl.append(k)
            dur.append(op_seconds(st, o.kind))
            if o.kind == "F":
                cin.append(fwd_in[k])
                cout.append(fwd_out[k])
                free.append(False)
            else:
                cin.append(bwd_in[k] if o.kind == "B" else -1)
                cout.append(bwd_out[k] if o.kind == "B" else -1)
                free.append(last_bwd.get((o.mb, o.chunk)) == i)
            iend.append(j if (train and last_of_iter.get((o.chunk, j)) == i) else -1)
            gate.append(gate_at.get(i, -1))
            rep_ring = pd and cfg.allreduce and st.replicas > 1
            argate.append(o.mb - ar_gate if rep_ring and o.kind == "B" and o.mb >= ar_gate else -1)
        for lst, val in ((op_kind, kinds), (op_mb, mbl), (op_chunk, chl), (op_stage, stl), (op_dur, dur),
                         (op_in, cin), (op_out, cout), (op_free, free), (op_iter_end, iend), (op_gate, gate),
                         (op_argate, argate)):
            lst.append(val)

    # --- all-reduce rings -------------------------------------------------------------
    bpe = _bytes_per_element(plan.number_format)
    if cfg.allreduce_per not in ("stage", "device"):
        raise SpecError(None, None, "allreduce_per", f"expected 'stage' or 'device', got {cfg.allreduce_per!r}")
    per_device = cfg.allreduce_per == "device"
    dev_rep = {}  # device -> its first stage (carries the device's ring in "device" mode)
    for k, st in enumerate(stages):
        dev_rep.setdefault(st.device, k)

    def grad_bytes(st) -> float:
        # the plan's weight bytes are the gradient bytes (same format); else count the params
        return st.weight_bytes or sum(l.weight_params for l in model.layers[st.first:st.last + 1]) * bpe

    rings = []  # per stage: None or (pieces per replica step i -> i+1, steps, replicas)
    for k, st in enumerate(stages):
        r = max(1, st.replicas)
        if not (train and cfg.allreduce and r > 1) or (per_device and dev_rep[st.device] != k):
            rings.append(None)
            continue
        grad = sum(grad_bytes(x) for x in stages if x.device == st.device) if per_device else grad_bytes(st)
        share = ring_share(grad, r)
        leads = replica_leads(st)
        hops = []
        for i in range(r):
            ids, bw, lat = net.path(leads[i], leads[(i + 1) % r])
            # between FPGAs the step carries the exact gradient sums, framed (collective.ring_hop_s)
            # synchronous schedules only: the asynchronous ones' per-micro-batch rings (not built
            # in RTL) still move the weight bytes, as the planner prices them
            clk = None if plan.schedule in ("pipedream", "2bw") else link_clock(
                cluster.board(leads[i]).board, cluster.board(leads[(i + 1) % r]).board)
            occ, lat = ring_hop_s(grad, bpe, r, bw, lat, clk)
            hops.append((ids, occ if ids else 0.0, lat, share))
        rings.append((hops, ring_steps(r), r))
    # per (stage, iteration): remaining replicas to finish; per device and iteration: stages left
    ar_left: dict[tuple[int, int], int] = {}
    ar_start: dict[tuple[int, int], float] = {}
    dev_stages = [sum(1 for s in stages if s.device == d) for d in range(p)]
    dev_iter_left: dict[tuple[int, int], int] = {}
    dev_bwd_left: dict[tuple[int, int], int] = {}
    dev_stage_ids = [[k for k, s in enumerate(stages) if s.device == d] for d in range(p)]
    dev_iter_done: dict[tuple[int, int], float] = {}
    iter_end = [0.0] * N
    ar_done_mb: set = set()                     # PipeDream: (stage, micro-batch) all-reduced
    pd_left: dict[tuple[int, int], int] = {}    # PipeDream: (stage, iteration) rings + last B pending

    # --- memory -----------------------------------------------------------------------
    # static bytes (weights x copies, optimizer state, line buffers) are what the plan's
    # memory_bytes holds beyond its stashes; stash_bytes covers ``stashes`` micro-batches
    weights = [0] * p
    for st in stages:
        static = st.memory_bytes - st.stash_bytes if st.memory_bytes >= st.stash_bytes + st.weight_bytes else 0
        weights[st.device] += int(max(static, st.weight_bytes))
    stash = [(st.stash_bytes / st.stashes if st.stashes > 0 else st.stash_bytes) if train else 0 for st in stages]
    live = weights[:]
    peak = weights[:]
    mem_tl: list[list[tuple[float, int]]] = [[(0.0, w)] for w in weights]

    # --- engine state -----------------------------------------------------------------
    idx = [0] * p
    nops = [len(x) for x in op_kind]
    busy_flag = [False] * p
    busy_s = [0.0] * p
    stall_s = [0.0] * p
    wait_kind = [0] * p      # 0 not waiting, 1 bubble (input / gate), 2 stall (no transmit slot)
    wait_since = [0.0] * p
    cur_start = [0.0] * p
    heap: list = []
    seq_no = 0
    n_events = 0
    record = cfg.record
    rec_ops: list[tuple] = []
    rec_tx: list[tuple] = []
    rec_stall: list[tuple] = []
    rec_ar: list[tuple] = []
    push, pop = heapq.heappush, heapq.heappop
    net_free, net_busy, net_bytes, net_count, net_names = net.free, net.busy, net.nbytes, net.count, net.names
    tx_slots = cfg.tx_slots

    def reserve(pieces, now: float, label) -> float:
        """Reserve each piece's route; return when the last piece has arrived."""
        arrive = now
        for ids, wire, lat, nb in pieces:
            start = hold(net_free, ids, now, wire)   # the planner's replay holds links the same way
            end = start + wire
            for i in ids:
                net_busy[i] += wire
                net_bytes[i] += nb
                net_count[i] += 1
                if record:
                    rec_tx.append((net_names[i], start, end, label))
            if end + lat > arrive:
                arrive = end + lat
        return arrive

    def try_send(ci: int, now: float) -> None:
        nonlocal seq_no
        ch = channels[ci]
        q = ch.queue
        while q and ch.credits > 0:
            mb = q.popleft()
            ch.credits -= 1
            ch.inflight += 1
            if ch.inflight > ch.peak_inflight:
                ch.peak_inflight = ch.inflight
            t = reserve(ch.pieces, now, mb)
            seq_no += 1
            push(heap, (t, seq_no, _ARRIVE, ci, mb))
        if ch.blocked and len(q) < tx_slots:
            ch.blocked = False
            try_start(ch.src, now)

    def try_start(d: int, now: float) -> None:
        nonlocal seq_no
        if busy_flag[d]:
            return
        i = idx[d]
        if i >= nops[d]:
            return
        g = op_gate[d][i]
        ga = op_argate[d][i]
        reason = 0
        if g >= 0 and (d, g) not in dev_iter_done:
            reason = 1
        elif ga >= 0 and (op_stage[d][i], ga) not in ar_done_mb:
            reason = 1
        else:
            ci = op_in[d][i]
            mb = op_mb[d][i]
            if ci >= 0 and mb not in channels[ci].arrived:
                reason = 1
            else:
                co = op_out[d][i]
                if co >= 0 and len(channels[co].queue) >= tx_slots:
                    channels[co].blocked = True
                    reason = 2
        if reason:
            wk = wait_kind[d]
            if wk != reason:
                if wk == 2:
                    stall_s[d] += now - wait_since[d]
                    if record:
                        rec_stall.append((d, wait_since[d], now))
                wait_kind[d] = reason
                wait_since[d] = now
            return
        # start the op
        if wait_kind[d] == 2:
            stall_s[d] += now - wait_since[d]
            if record:
                rec_stall.append((d, wait_since[d], now))
        wait_kind[d] = 0
        if ci >= 0:
            ch = channels[ci]
            ch.arrived.discard(mb)
            ch.inflight -= 1
            if ch.src < 0:
                ch.credits += 1
                try_send(ci, now)
            else:
                seq_no += 1
                push(heap, (now + ch.credit_lat, seq_no, _CREDIT, ci, 0))
        if op_kind[d][i] == 0:
            sb = stash[op_stage[d][i]]
            if sb:
                live[d] += sb
                if live[d] > peak[d]:
                    peak[d] = live[d]
                if record:
                    mem_tl[d].append((now, live[d]))
        busy_flag[d] = True
        cur_start[d] = now
        dt = op_dur[d][i]
        busy_s[d] += dt
        seq_no += 1
        push(heap, (now + dt, seq_no, _OP_DONE, d, 0))

    def stage_done(k: int, j: int, now: float) -> None:
        """Stage k finished iteration j (last backward, plus its all-reduce)."""
        d = stages[k].device
        key = (d, j)
        left = dev_iter_left.get(key, dev_stages[d]) - 1
        dev_iter_left[key] = left
        if now > iter_end[j]:
            iter_end[j] = now
        if left == 0:
            dev_iter_done[key] = now
            try_start(d, now)

    def pd_step(k: int, j: int, now: float) -> None:
        """PipeDream: one of stage k's pending events of iteration j (a micro-batch's ring or
        the iteration's last backward) is over; the stage is done with j after all of them."""
        key = (k, j)
        left = pd_left.get(key, m + 1) - 1
        pd_left[key] = left
        if left == 0:
            stage_done(k, j, now)

    def start_allreduce(k: int, j, now: float) -> None:
        nonlocal seq_no
        hops, steps, r = rings[k]
        ar_left[(k, j)] = r
        ar_start[(k, j)] = now
        for i in range(r):
            t = reserve((hops[i],), now, f"allreduce s{k}")
            seq_no += 1
            push(heap, (t, seq_no, _AR_ARRIVE, (k, j, 0), (i + 1) % r))

    def on_done(d: int, now: float) -> None:
        i = idx[d]
        busy_flag[d] = False
        kind = op_kind[d][i]
        mb = op_mb[d][i]
        if record:
            rec_ops.append((d, KINDS[kind], mb, op_chunk[d][i], cur_start[d], now))
        if op_free[d][i]:
            sb = stash[op_stage[d][i]]
            if sb:
                live[d] -= sb
                if record:
                    mem_tl[d].append((now, live[d]))
        co = op_out[d][i]
        idx[d] = i + 1
        if co >= 0:
            channels[co].queue.append(mb)
            try_send(co, now)
        if not train and op_stage[d][i] == S - 1 and mb // m < N and now > iter_end[mb // m]:
            iter_end[mb // m] = now  # forward-only: an iteration ends when its last micro-batch leaves
        j = op_iter_end[d][i]
        if pd and kind == 1 and rings[op_stage[d][i]] is not None:
            start_allreduce(op_stage[d][i], ("mb", mb), now)   # after the gradient has left
        if j >= 0 and pd and rings[op_stage[d][i]] is not None:
            pd_step(op_stage[d][i], j, now)
        elif j >= 0:
            k = op_stage[d][i]
            if per_device:
                key = (d, j)
                left = dev_bwd_left.get(key, dev_stages[d]) - 1
                dev_bwd_left[key] = left
                if left == 0:
                    kr = dev_rep[d]
                    if rings[kr] is not None:
                        start_allreduce(kr, j, now)
                    else:
                        for kk in dev_stage_ids[d]:
                            stage_done(kk, j, now)
            elif rings[k] is not None:
                start_allreduce(k, j, now)
            else:
                stage_done(k, j, now)
        try_start(d, now)

    for d in range(p):
        try_start(d, 0.0)
    if cfg.host_io:
        # the host staged the first inputs during the previous iteration (a training loop
        # overlaps them), so they sit in the receive buffer at t=0; the rest stream over PCIe
        ci = fwd_in[0]
        ch = channels[ci]
        first = min(ch.credits, m * N) if cfg.prefetch_input else 0
        ch.arrived.update(range(first))
        ch.credits -= first
        ch.inflight = ch.peak_inflight = first
        ch.queue.extend(range(first, m * N))
        try_send(ci, 0.0)
        for d in range(p):
            try_start(d, 0.0)

    now = 0.0
    while heap:
        now, _, code, x, y = pop(heap)
        n_events += 1
        if code == _OP_DONE:
            on_done(x, now)
        elif code == _ARRIVE:
            ch = channels[x]
            if ch.dst < 0:          # the host drains its output at once
                ch.inflight -= 1
                ch.credits += 1
                try_send(x, now)
                if not train:
                    j = y // m
                    if now > iter_end[j]:
                        iter_end[j] = now
            else:
                ch.arrived.add(y)
                try_start(ch.dst, now)
        elif code == _CREDIT:
            channels[x].credits += 1
            try_send(x, now)
        else:  # all-reduce step arrived at replica y
            k, j, step = x
            hops, steps, r = rings[k]
            if step + 1 < steps:
                t = reserve((hops[y],), now, f"allreduce s{k}")
                seq_no += 1
                push(heap, (t, seq_no, _AR_ARRIVE, (k, j, step + 1), (y + 1) % r))
            else:
                ar_left[(k, j)] -= 1
                if ar_left[(k, j)] == 0 and isinstance(j, tuple):   # PipeDream: one micro-batch's ring
                    mbk = j[1]
                    ar_done_mb.add((k, mbk))
                    if record:
                        rec_ar.append((stages[k].index, mbk // m, ar_start[(k, j)], now))
                    pd_step(k, mbk // m, now)
                    try_start(stages[k].device, now)
                elif ar_left[(k, j)] == 0:
                    if record:
                        rec_ar.append((stages[k].index, j, ar_start[(k, j)], now))
                    for kk in (dev_stage_ids[stages[k].device] if per_device else (k,)):
                        stage_done(kk, j, now)

    stuck = [d for d in range(p) if idx[d] < nops[d]]
    if stuck:
        d = stuck[0]
        i = idx[d]
        what = f"{KINDS[op_kind[d][i]]}{op_mb[d][i]}" + (f".{op_chunk[d][i]}" if op_chunk[d][i] else "")
        raise SpecError(None, None, "sim", f"deadlock at t={now:.6g} s: device {d} cannot start {what} "
                                           f"(rx_credits={cfg.rx_credits}, tx_slots={cfg.tx_slots}); "
                                           "expected larger receive buffers")
    # the run ends with the last iteration (last backward / all-reduce, or the last output at
    # the host), not with trailing bookkeeping such as credits flowing back
    makespan = max(iter_end) if max(iter_end) > 0 else now
    for d in range(p):  # close waits still open at the end (idle tails count as bubble)
        if wait_kind[d] == 2 and wait_since[d] < makespan:
            stall_s[d] += makespan - wait_since[d]
            if record:
                rec_stall.append((d, wait_since[d], makespan))

    from .boards import on_chip_bytes
    boards_out: list[BoardStats] = []
    buf_bytes = [0] * p
    for ch in channels:
        if ch.dst >= 0:
            buf_bytes[ch.dst] += ch.peak_inflight * ch.msg_bytes
    for d in range(p):
        for b in dev_boards[d]:
            board = cluster.board(b).board
            cap = on_chip_bytes(board)
            boards_out.append(BoardStats(
                name=b, device=d, clock_hz=board.clock_hz, busy_s=busy_s[d], stall_s=stall_s[d],
                bubble_s=max(0.0, makespan - busy_s[d] - stall_s[d]), makespan_s=makespan,
                peak_memory_bytes=round(peak[d]), peak_onchip_bytes=round(min(peak[d], cap)),
                peak_offchip_bytes=round(max(0, peak[d] - cap)), peak_buffer_bytes=buf_bytes[d]))
    links_out = [LinkStats(name=net.names[i], kind=net.kinds[i], bandwidth_Bps=net.bw[i], busy_s=net.busy[i],
                           bytes=int(round(net.nbytes[i])), transfers=net.count[i],
                           utilisation=net.busy[i] / makespan if makespan else 0.0)
                 for i in range(len(net.names))]
    total_busy = sum(busy_s)
    bubble_fraction = 1.0 - total_busy / (p * makespan) if makespan else 0.0
    bubble_ratio = (p * makespan - total_busy) / total_busy if total_busy else 0.0
    ref_clock = cluster.board(dev_boards[0][0]).board.clock_hz
    return SimResult(
        plan_model=plan.model, plan_cluster=plan.cluster, schedule=sched, mode=plan.mode, devices=p, chunks=v,
        microbatches=m, iterations=N, samples_per_iteration=samples, makespan_s=makespan,
        iteration_time_s=makespan / N, iteration_ends_s=list(iter_end), bubble_fraction=bubble_fraction,
        bubble_ratio=bubble_ratio, boards=boards_out, links=links_out, device_boards=dev_boards,
        events=n_events, wall_s=time.perf_counter() - t_wall, ops=rec_ops, transfers=rec_tx, stalls=rec_stall,
        allreduces=rec_ar, memory=mem_tl, reference_clock_hz=ref_clock,
        stage_boards={s.index: list(s.boards) for s in stages})
