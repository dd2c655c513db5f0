"""BaPipe exploration: schedules x micro-batching x replication x exact partitions.

For every configuration (schedule, chunks v, replication r, stages p = boards / r,
micro-batches m, activation recomputation) the exact partition DP (planner.partition)
minimises the closed-form objective J; the best few by J are replayed op by op
(planner.pipeline.replay) and the fastest replay is the plan. Configurations are visited
in order of a lower bound on J and skipped once the bound exceeds the best J found.
"""
from __future__ import annotations

import math
from functools import lru_cache
from dataclasses import dataclass, field, replace

import numpy as np

from bapipe.errors import SpecError
from bapipe.schedules import (ASYNC, MAX_MICROBATCHES, SCHEDULES, chunk_stash_count, gradient_buffers, stash_count,
                              stashes_weights,
                              weight_versions)
from bapipe.spec import Model
from bapipe.fpga_models.boards import bytes_per_element
from bapipe.fpga_models.engines import link_clock, link_transfer
from bapipe.fpga_models.cluster import Cluster

from . import partition as part
from bapipe.fpga_models.allocate import (allocate_stage, bwd_block_room, engine_share, kernel_onchip_budget,
                                         stage_port_lanes, tm_spill_cycles, tm_weight_bank_seconds,
                                         tm_weight_cycles)
from bapipe.fpga_models.bwd_memory import bwd_flush_cycles, dataflow_bwd_cycles, stage_blocks_fit, tm_bwd_extra_cycles
from bapipe.fpga_models.gradients import no_input_gradient

from .peer_pipedream import PeerInput, cluster_levels, solve as peer_solve
from .peer_search import search as flat_search
from .layouts import dp_layouts
from .placement import PLACE_WORK, board_classes, placements
from bapipe.fpga_models.collective import ring_allreduce_fpga_s, ring_allreduce_s, ring_hop_s, ring_steps
from bapipe.fpga_models import allreduce as ar_model
from bapipe.fpga_models.update import Tail, bank_Bps, engine_kernel, layer_tail, stage_tail
from .pipeline import replay, replay_2bw, replay_pipedream, steady_pipedream
from .mesh import Resharder, cut_layouts, cut_shape, tp_stage_model
from .stagecost import LayerTable, StageModel, cut_bytes, layer_table, layer_times, stage_model

SLACK = 0.25        # how far J may be from the replayed time (relative)
MAX_REPLAYS = 3     # distinct candidates replayed per schedule per search (recomputation variants compete too)
MAX_M_CANDIDATES = 12
INTERLEAVE_CHUNKS = (2, 3, 4)   # interleaved: chunks v a board searched (Narayanan et al. SC'21 use 2-4 and more)
# how far above the best J the first candidate of a (pipeline depth, boards used) may be: J
# prices FPGA stages time-multiplexed, the replay may run them as dataflow pipelines, measured
# up to 3.3x faster (tiny-cnn on 2 U250 replicas, m = 3: J 73.7 us, replayed 22.3 us); at 1.0
# that configuration was never replayed and tiny-cnn on hetero-mix planned 31.1 us while its
# --pareto listed 23.7 us (docs/planner.md, section 6)
DEPTH_SLACK = 3.0
GROUP_SLACK = 0.05  # explore's slack for per-position replica groups (see explore)
REPLAY_M = 128      # micro-batches replayed exactly before the replay is extrapolated (finish)
#: replays the polish step may spend on every micro-batch count; past it (a --global-batch of
#: 10**5 or more has dozens of counts) it replays the counts within POLISH_SPAN times the
#: winner's only (the closed form J picks m from is off by small factors, not orders of magnitude)
POLISH_WORK = 96
#: replays the final plan's schedule sweeps and cut moves may spend (Explorer.retune, nudge), and the deepest pipeline they
#: run on (a 64-stage gpt3-175b replay costs tens of milliseconds: its 2 s budget would not hold)
NUDGE_WORK = 192
NUDGE_STAGES = 8
NUDGE_CONFIGS = 3   # the final partition's fastest configurations each cut move is replayed under
POLISH_SPAN = 4
GROUP_BOARDS = 8    # clusters up to this size search every per-position replica vector
STREAM_K = 16       # asynchronous PipeDream: J of a stream of this many iterations (Explorer.jm)
HIER_BOARDS = 16    # beyond GROUP_BOARDS and up to this size: PipeDream's hierarchical DP proposes groups
HIER_BLOCKS = 64    # hier_layouts: the DP's layers (larger models merge consecutive layers into blocks)
STAGE_TIMES_BYTES = 64 << 20   # stage-time tables kept between problem() calls (planner memory budget 500 MB)


#: schedules that change training semantics (stale weights): never chosen by auto
ASYNC_SCHEDULES = ASYNC


def memory_key(schedule: str) -> tuple:
    """What of a schedule the stage memory model depends on (cache keys): weight versions,
    weight stashing, gradient buffers."""
    return (weight_versions(schedule), stashes_weights(schedule), gradient_buffers(schedule))


@dataclass
class Request:
    """What the user asked for (CLI options, already validated)."""

    schedule: str = "auto"
    microbatches: int | None = None      # None = explore
    global_batch: int | None = None      # None = 8 x boards
    fmt: str = "fixed16"
    mode: str = "train"
    optimizer: str = "sgd"
    cap: float = 0.8
    replication: bool = True
    max_boards: int | None = None
    partition: list[tuple] | None = None   # (first, last, replicas or None, board names or None) per stage
    measured: dict | None = None         # {board type or None: {layer: {fwd_s, bwd_s}}} per sample
    meshes: tuple[int, ...] | None = (1,)   # tensor-parallel mesh sizes to explore (None = auto)
    whole_blocks: bool = False           # cut only where one tensor crosses (no open skip)
    placement_limit: int | None = None   # every placement searched up to this work (None: PLACE_WORK)


@dataclass(frozen=True, order=True)
class Config:
    """One point of the search space."""

    schedule: str
    v: int
    r: int
    p: int
    m: int
    beta: int
    recompute: bool
    k: int = 1          # boards of each stage's tensor-parallel mesh (1 x k, one host; r = 1 when k > 1)
    kv: tuple[int, ...] = ()   # per pipeline position mesh sizes when they differ (then k = max, r = 1)
    # explicit boards (indices into Explorer.boards) of each pipeline position, its replicas in
    # ring order; () = r consecutive boards per position from board 0. With groups, r = 1 and
    # beta is the whole micro-batch: position d's replicas take ceil(beta / len(groups[d])) each.
    groups: tuple[tuple[int, ...], ...] = ()


@dataclass
class Candidate:
    """A configuration with its optimal partition and (after replay) its iteration time."""

    config: Config
    bounds: list[tuple[int, int]]
    objective: float
    exact: bool = True
    iteration_s: float | None = None          # per iteration in steady state (what ranks plans)
    first_iteration_s: float | None = None    # one iteration from an empty pipeline (= iteration_s with a flush)
    bubble: float | None = None
    stages: list[dict] = field(default_factory=list)
    boards_used: int = 0

    @property
    def peak_memory(self) -> int:
        """Most memory any board holds (device total over its chunks)."""
        per_dev: dict[int, int] = {}
        for s in self.stages:
            per_dev[s["device"]] = per_dev.get(s["device"], 0) + s["memory_bytes"]
        return max(per_dev.values()) if per_dev else 0


def profile_bytes(model: Model, meas: dict, bpe: int) -> dict | None:
    """Per-sample byte arrays from a measured profile ({layer: {activation_bytes,
    param_bytes, ...}} at batch 1): ``param`` per layer, ``in`` (the inputs every layer's
    backward needs), ``cut`` (bytes crossing the cut after each layer: every open tensor)
    and ``first_in`` (the model inputs entering stage 0). Model inputs, which a profile does
    not cover, count their elements x ``bpe``. None when the profile gives no bytes."""
    names = [l.name for l in model.layers]
    if not all("activation_bytes" in meas[n] and "param_bytes" in meas[n] for n in names):
        return None
    size = {i.name: float(math.prod(i.shape) * bpe) for i in model.inputs}
    size.update({n: float(meas[n]["activation_bytes"]) for n in names})
    param = np.array([float(meas[n]["param_bytes"]) for n in names])
    inn = np.array([sum(size[t] for t in l.inputs) for l in model.layers])
    cut = np.array([sum(size[t.producer] for t in model.cut_tensors(k)) for k in range(len(names) - 1)])
    first = sum(size[i.name] for i in model.inputs)
    return {"param": param, "in": inn, "cut": cut, "first_in": first}


def _ckey(c: Config) -> tuple:
    """Config's sort key as a plain tuple (sorting tens of thousands of configurations with
    the dataclass's generated comparisons costs seconds)."""
    return (c.schedule, c.v, c.r, c.p, c.m, c.beta, c.recompute, c.k, c.kv, c.groups)


@lru_cache(maxsize=None)
def stashes_at(schedule: str, p: int, d: int, m: int, v: int = 1) -> int:
    """bapipe.schedules.stash_count (its closed forms, else the op-order walk), cached: the
    search asks for the same few counts many times."""
    return stash_count(schedule, p, d, m, v)


def chunk_stashes_at(schedule: str, p: int, d: int, m: int, v: int, chunk: int) -> int:
    """bapipe.schedules.chunk_stash_count, cached, with m clamped to 4p for interleaving: after
    its warm-up of at most (v + 1) p chunk-ops, Megatron's interleaved order runs one backward
    and one forward a step, and which chunk each op belongs to repeats every p v ops, so a
    chunk's live stashes repeat with period p v until the forwards run out (then they only
    fall). With m v >= warm-up + p v (m >= 4p is enough) the peak is reached within that first
    period and does not depend on m: --global-batch 100000 walked 10^5-op orders per chunk
    (tests/test_planner_layout_dp.py checks m = 4p..12p against the walk)."""
    if schedule == "interleaved" and m > 4 * p and m % p == 0:
        m = 4 * p
    return _chunk_stashes(schedule, p, d, m, v, chunk)


@lru_cache(maxsize=None)
def _chunk_stashes(schedule: str, p: int, d: int, m: int, v: int, chunk: int) -> int:
    return chunk_stash_count(schedule, p, d, m, v, chunk)


def canonical_order(cluster: Cluster, boards: list) -> list:
    """The planner's topology order of ``boards``: on a switched cluster, host-major (hosts in
    the cluster's host order, each host's boards in its own order), whatever order the boards
    are listed in. A switch's routes do not depend on the listing, so two listings of the same
    hardware (boards renamed or listed in another order) are then searched in the same order
    and plan the same time (tests/test_planner_layout_dp.py permutes them). Chains, rings and
    tori are laid out in listing order (their links follow it): kept as listed."""
    if cluster.topology != "switch":
        return list(boards)
    rank = {h.name: k for k, h in enumerate(cluster.hosts)}
    pos = {b: k for h in cluster.hosts for k, b in enumerate(h.boards)}
    return sorted(boards, key=lambda cb: (rank.get(cb.host, len(rank)), pos.get(cb.name, 0)))


class _BlockMask:
    """A stage model's block-fit mask, built on first use (Explorer.block_mask); a class, not a
    closure, so that an Outcome holding its Explorer pickles."""

    def __init__(self, ex: "Explorer", btype: str, v: int):
        self.ex, self.btype, self.v = ex, btype, v

    def __call__(self, sm) -> np.ndarray:
        return self.ex.block_mask(self.btype, self.v, sm)


class Explorer:
    """Holds the per-board-type tables of one model on one cluster and searches plans."""

    def __init__(self, model: Model, cluster: Cluster, req: Request, fold_scale: float = 1.0):
        self.model, self.cluster, self.req = model, cluster, req
        # the share of each stage's DSP/LUT budget its layers are folded within (1: all of it;
        # planner.planning.make_plan lowers it when no plan's kernels fit the boards' blocks)
        self.fold_scale = fold_scale
        boards = list(cluster.boards)
        if req.max_boards is not None:
            if not 1 <= req.max_boards <= len(boards):
                raise SpecError(None, None, "--boards", f"expected 1..{len(boards)}, got {req.max_boards}")
            boards = boards[: req.max_boards]
        self.boards = canonical_order(cluster, boards)
        self.N = len(boards)
        self.G = req.global_batch or 8 * self.N
        self.bpe = bytes_per_element(req.fmt)
        self.tables: dict[str, LayerTable] = {}   # per board type, one stage per board (v = 1)
        self._vtables: dict[tuple[str, int], LayerTable] = {}   # (board type, stages per board)
        self._meas: dict[str, dict | None] = {}
        self.prof_bytes: dict[str, dict | None] = {}   # per board type: bytes a measured profile gives
        for cb in boards:
            name = cb.board.name
            if name not in self.tables:
                meas = None
                if req.measured is not None:   # {board type or None: {layer: times}} (bapipe.profiles)
                    meas = req.measured.get(name, req.measured.get(None))
                    if meas is None:
                        raise SpecError(None, None, "--profile", f"the profile has no times for board type {name} "
                                        f"(it has {', '.join(str(k) for k in req.measured)})")
                self._meas[name] = meas
                self.tables[name] = self.table(name, 1, cb.board)
                self.prof_bytes[name] = profile_bytes(model, meas, self.bpe_of_fmt(req.fmt)) if meas else None
        self._sm: dict[tuple, StageModel] = {}
        self._links: dict[tuple, tuple[float, float]] = {}
        self._band: dict[tuple, int] = {}
        self._link_index: dict = {}
        self._solved: dict[tuple, Candidate | None] = {}
        self._stage_times: dict[tuple, np.ndarray] = {}   # problem(): stage-time tables (before tmax)
        self._stage_times_bytes = 0
        self._lb: dict[Config, float] = {}
        self._hier_bounds: dict[tuple, list] = {}   # hier_layouts: the DP's partitions of each layout
        self._types: dict[tuple, str | None] = {}
        self._kinds: dict[tuple, tuple] = {}
        self.n = len(model.layers)
        self.train = req.mode == "train"
        self.layouts = cut_layouts(model)
        self.placement_exact = False   # every placement searched (every_placement), not board orders
        self.resharder = Resharder(cluster, self.bpe)

    # ---- building blocks -------------------------------------------------------------
    def table(self, btype: str, v: int = 1, board=None) -> LayerTable:
        """Per-layer table of one board type with ``v`` stages on each board: every layer folded
        within one stage's share of the capped budget (fpga_models.allocate.engine_share: the
        board's forward and, training, backward kernels split it), cached per (type, v)."""
        key = (btype, v)
        if key not in self._vtables:
            board = board if board is not None else self.tables[btype].board
            share = engine_share(v, self.req.mode == "train")
            self._vtables[key] = layer_table(self.model, board, self.req.fmt, self.req.cap * share * self.fold_scale,
                                             self._meas[btype], self.req.mode == "train")
        return self._vtables[key]

    def stage_model(self, btype: str, beta: int, recompute: bool, schedule: str, k: int = 1,
                    v: int = 1) -> StageModel:
        """Prefix-sum stage model of one board type with ``v`` stages per board (cached); k > 1:
        a 1 x k tensor-parallel mesh (planner.mesh) whose collectives run on the first k boards' ring."""
        key = (btype, beta, recompute, memory_key(schedule), k, v)
        if key not in self._sm:
            if k > 1:
                base = self.stage_model(btype, beta, recompute, schedule, 1, v)
                bw, lat = self.ring(self.boards[:k])
                self._sm[key] = tp_stage_model(base, self.model, k, self.req.fmt, bw, lat)
            else:
                sm = stage_model(self.model, self.table(btype, v), beta, self.req.fmt, self.req.cap,
                                 self.req.mode, self.req.optimizer, weight_versions(schedule), recompute,
                                 stashes_weights(schedule), gradient_buffers(schedule))
                table = self.table(btype, v)
                if table.board.kind == "fpga" and table.measured_f is None:
                    sm = replace(sm, fits=_BlockMask(self, btype, v))
                pb = self.prof_bytes.get(btype)
                if pb is not None:
                    # a measured profile's bytes are used as given (a fp32 GPU profile planned
                    # in fixed16 still moves and stashes fp32 tensors): weights, every layer's
                    # stashed inputs and the bytes entering a stage
                    z = lambda x: np.concatenate([[0.0], np.cumsum(x)])  # noqa: E731
                    sm = replace(sm, PW=z(pb["param"]), PA=z(pb["in"] * beta),
                                 IN=np.concatenate([[pb["first_in"]], pb["cut"]]) * beta)
                self._sm[key] = sm
        return self._sm[key]

    def block_mask(self, btype: str, v: int, sm: StageModel | None = None) -> np.ndarray:
        """``[i, j]``: whether a time-multiplexed stage of layers i..j on a board of ``btype`` (``v``
        stages a board, the table's folding, its port at layer i - 1's output beat) fits the
        board's BRAM and URAM (fpga_models.bwd_memory.stage_blocks_fit: the check :meth:`finish`
        makes exactly). The weight-gradient sums are sized for the whole global batch (the widest
        a replica's can be). A stage's blocks grow with its layers, so per first layer the longest
        range that fits is found by bisection (log n checks, not n: resnet50's 14k ranges at ~10 ms
        each would take minutes), among the ranges whose bytes fit (``sm``'s memory with no
        stash: longer ones never fit); :meth:`finish` still checks the chosen stages exactly.
        Cached per (type, v)."""
        key = ("blockmask", btype, v)
        if key not in self._links:
            table, n = self.table(btype, v), self.n
            fmt, cap, train = self.req.fmt, self.req.cap, self.train

            def fit(i: int, j: int, port) -> bool:
                lyr = list(self.model.layers[i:j + 1])
                fold = {l.name: table.fold[i + k] for k, l in enumerate(lyr)}
                room = bwd_block_room(lyr, table.board, fold, fmt, cap, v, port) if train else None
                return stage_blocks_fit(self.model, lyr, table.board, fold, fmt, cap, v, train, "time-multiplexed",
                                        1, self.G, port, room)

            fits = np.zeros((n, n), dtype=bool)
            bare = replace(sm, fits=None) if sm is not None else None   # its bytes alone
            for i in range(n):
                last = n - 1
                if bare is not None:   # the longest range from i whose bytes fit (memory grows with j)
                    ok = np.asarray(bare.cost(np.full(n - i, i), np.arange(i, n), 0.0, v)["feasible"], dtype=bool)
                    last = i + int(np.nonzero(ok)[0].max()) if ok.any() else i - 1
                if last < i:
                    continue
                port = stage_port_lanes(self.model.layers[i - 1], table.fold[i - 1]) if i else None
                lo, hi = i - 1, last + 1       # ranges i..lo fit, i..hi does not
                if fit(i, last, port):
                    lo = last
                else:
                    hi = last
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if fit(i, mid, port) else (lo, mid)
                fits[i, i:lo + 1] = True
            fits.setflags(write=False)
            self._links[key] = fits
        return self._links[key]

    @staticmethod
    def bpe_of_fmt(fmt: str) -> int:
        """Bytes per element of a number format (model inputs a profile does not cover)."""
        return bytes_per_element(fmt)

    def cut_bytes_at(self, c: Config, d: int) -> np.ndarray:
        """Bytes per replica crossing each cut when position d sends (length n - 1): the
        profile's activation bytes when position d's board type has them, else the model's
        cut elements x bytes per element."""
        beta = self.beta_at(c, d)
        pb = self.prof_bytes.get(self.stage_type(c, d) or "")
        if pb is not None:
            return pb["cut"] * beta
        return cut_bytes(self.model, self.req.fmt, beta)

    def group(self, r: int, d: int) -> list:
        """Boards of replica group d (r consecutive boards in topology order)."""
        return self.boards[d * r:(d + 1) * r]

    def group_type(self, r: int, d: int) -> str | None:
        """Board type of group d, or None when the group mixes types."""
        types = {cb.board.name for cb in self.group(r, d)}
        return types.pop() if len(types) == 1 else None

    def dev_idx(self, c: Config, d: int) -> tuple[int, ...]:
        """Indices (into self.boards) of every board of pipeline position d: its replicas
        (each a mesh of kd boards), in the order their ring all-reduce visits them."""
        if c.groups:
            return c.groups[d]
        if c.kv:
            off = sum(c.kv[:d])
            return tuple(range(off, off + c.kv[d]))
        w = c.r * c.k
        return tuple(range(d * w, (d + 1) * w))

    def reps(self, c: Config, d: int) -> int:
        """Data-parallel replicas of pipeline position d (the boards of a mesh are one replica)."""
        return len(self.dev_idx(c, d)) // self.kd(c, d)

    def beta_at(self, c: Config, d: int) -> int:
        """Samples one replica of position d computes per micro-batch: the micro-batch
        (beta x r samples) split over its replicas, the first ones taking the remainder."""
        return -(-(c.beta * c.r) // self.reps(c, d))

    def replica_boards(self, c: Config, d: int) -> list:
        """The first board of every replica of position d (what transfers and rings connect)."""
        idx = self.dev_idx(c, d)
        k = self.kd(c, d)
        return [self.boards[idx[i * k]] for i in range(len(idx) // k)]

    def boards_used(self, c: Config) -> int:
        """Distinct boards a configuration occupies."""
        return len({i for d in range(c.p) for i in self.dev_idx(c, d)})

    def hop(self, a: str, b: str) -> tuple:
        """(directed link ids, slowest bandwidth, latency) of the route from board a to board b."""
        key = ("hop", a, b)
        if key not in self._links:
            if not self._link_index:
                self._link_index.update({ln: i for i, ln in enumerate(self.cluster.links)})
            hops, bw, lat = self.cluster.path(a, b)
            self._links[key] = (tuple((self._link_index[ln], ln.a == u) for u, _v, ln in hops), bw, lat)
        return self._links[key]

    def pieces(self, c: Config, d1: int, d2: int) -> tuple:
        """One transfer between positions d1 -> d2, as bapipe sim carries it: with r1 == r2
        replica k talks to replica k; otherwise max(r1, r2) pieces, piece i from replica
        i mod r1 to replica i mod r2. Per piece (directed link ids of the route, slowest
        bandwidth, route latency, share): ``share`` x the sending replica's bytes of the
        position that sends the forward activation (min(d1, d2) in pipeline order of the
        cut) travel in the piece, so the pieces together carry the whole micro-batch."""
        a, b = self.replica_boards(c, d1), self.replica_boards(c, d2)
        n = max(len(a), len(b))
        # the activation's sender holds 1/r of the micro-batch; the gradient coming back is
        # the same tensor, so both directions move r_sender x per-replica bytes in total
        r_sender = len(a) if self._forward(c, d1, d2) else len(b)
        return tuple(self.hop(a[i % len(a)].name, b[i % len(b)].name) + (r_sender / n,) for i in range(n))

    def framed_pieces(self, c: Config, d1: int, d2: int, payload: int, samples: int) -> tuple:
        """:meth:`pieces` d1 -> d2 as the replay reserves them: (directed link ids, busy seconds,
        latency) per piece, the piece's share of ``payload`` (the forward sender's bytes per
        replica, ``samples`` samples) framed on its own route (:meth:`framed`)."""
        a, b = self.replica_boards(c, d1), self.replica_boards(c, d2)
        out = []
        for i, (ids, bw, lat, sh) in enumerate(self.pieces(c, d1, d2)):
            line, extra = self.framed(a[i % len(a)], b[i % len(b)], payload, samples)
            out.append((ids, line * sh / bw, lat + extra))
        return tuple(out)

    @staticmethod
    def _forward(c: Config, d1: int, d2: int) -> bool:
        """Whether d1 -> d2 is the activation direction of a cut (interleaved cut p-1 -> 0 included;
        one chunk per board: only d1 + 1, else with p = 2 the gradient 1 -> 0 read as an
        activation and a 3-replica -> 1 cut's gradient was priced at a third of its bytes)."""
        return d2 == d1 + 1 if c.v == 1 else d2 == (d1 + 1) % c.p

    def _cfg_key(self, c: Config) -> tuple:
        return (c.r, c.k, c.kv, c.groups, c.p, c.v, self.train)

    def loads(self, c: Config) -> dict:
        """How many transfers of one micro-batch use each directed link (all cuts, both ways)."""
        key = ("loads",) + self._cfg_key(c)
        if key not in self._links:
            cnt: dict = {}
            V = c.p * c.v
            for s in range(V - 1):
                d1, d2 = s % c.p, (s + 1) % c.p
                pairs = [(d1, d2), (d2, d1)] if self.train else [(d1, d2)]
                for x, y in pairs:
                    for ids, _bw, _lat, _sh in self.pieces(c, x, y):
                        for i in ids:
                            cnt[i] = cnt.get(i, 0) + 1
            self._links[key] = cnt
        return self._links[key]

    def link(self, c: Config, d1: int, d2: int) -> tuple[float, float]:
        """(effective bandwidth, latency) from position d1 to d2 under configuration c, for
        the sending replica's bytes: a directed link carrying k transfers per micro-batch
        (replicas, other cuts, the gradients coming back) gives each 1/k of its bandwidth,
        and a piece carrying ``share`` x the bytes needs ``share`` x the time."""
        key = ("eff",) + self._cfg_key(c) + (d1, d2)
        if key not in self._links:
            load = self.loads(c)
            bw, lat = math.inf, 0.0
            links = self.cluster.links
            for ids, _b, plat, share in self.pieces(c, d1, d2):
                lat = max(lat, plat)
                for i in ids:
                    bw = min(bw, links[i[0]].bandwidth_Bps / load.get(i, 1) / share)
            self._links[key] = (bw, lat)
        return self._links[key]

    def framed(self, a, b, payload, samples: int) -> tuple:
        """(line bytes, framing latency s) of ``payload`` bytes (``samples`` samples) sent from
        cluster board a to b: fpga_models.engines.link_transfer over the route's slowest link
        at the two boards' transport clock (between FPGAs; otherwise the payload, no latency)."""
        _ids, bw, _lat = self.hop(a.name, b.name)
        return link_transfer(payload, self.bpe_of_fmt(self.req.fmt), samples, bw, link_clock(a.board, b.board))

    def line_at(self, c: Config, d: int) -> tuple[np.ndarray, np.ndarray]:
        """(line bytes, framing latency s) per cut position of the transfer from position d to
        the next, both ways (the gradient is the activation's tensor), over the first replicas'
        route: what occupies the link instead of the payload (:meth:`framed`)."""
        key = ("line",) + self._cfg_key(c) + (c.beta, d)
        if key not in self._links:
            a, b = self.replica_boards(c, d)[0], self.replica_boards(c, (d + 1) % c.p)[0]
            # the framing depends on the route's bandwidth, the transport clock, the payload
            # (the sender's board type and samples) only: shared by every pair of positions
            # with those (64xU55C's ring: one framing per micro-batch size, not one per cut)
            beta, bt = self.beta_at(c, d), self.stage_type(c, d)
            fkey = ("frame", self.hop(a.name, b.name)[1], link_clock(a.board, b.board), bt, beta)
            if fkey not in self._links:
                self._links[fkey] = self.framed(a, b, self.cut_bytes_at(c, d), beta)
            self._links[key] = self._links[fkey]
        return self._links[key]

    def ring(self, boards) -> tuple[float, float]:
        """(bandwidth, latency per step) of a ring all-reduce over ``boards`` in order (kept per
        board list: the lower bound asks for the same rings hundreds of thousands of times)."""
        if len(boards) < 2:
            return math.inf, 0.0
        key = ("ring",) + tuple(b.name for b in boards)
        if key not in self._links:
            bw, lat = math.inf, 0.0
            for a, b in zip(boards, boards[1:] + boards[:1]):
                bw = min(bw, self.cluster.path_bandwidth(a.name, b.name))
                lat = max(lat, self.cluster.path_latency(a.name, b.name))
            self._links[key] = (bw, lat)
        return self._links[key]

    def stashes(self, c: Config, d: int) -> int:
        """Micro-batches whose activations virtual stage d (chunk d // p of device d % p) holds at its
        peak: its own stash memory, as the training RTL builds it (one a chunk)."""
        if not self.train:
            return 0
        # one stage too follows its schedule's op order: GPipe's gradient accumulation runs
        # all m forwards first (m stashes), 1F1B alternates (one)
        if c.v == 1:
            return stashes_at(c.schedule, c.p, d % c.p, c.m, 1)
        return chunk_stashes_at(c.schedule, c.p, d % c.p, c.m, c.v, d // c.p)

    # ---- problem construction -------------------------------------------------------------
    def band_length(self, c: Config, tmax: float = math.inf) -> int:
        """Longest layer range any stage could hold in memory, and (when ``tmax`` is finite)
        whose compute fits in ``tmax`` on the fastest board type (bounds the DP band)."""
        smin = min(self.stashes(c, d) for d in range(c.p * c.v))
        kinds = self.kinds(c)
        key = (kinds, c.recompute, memory_key(c.schedule), smin, c.v)
        if key not in self._band:
            best = 0
            for btype, kk, beta in kinds:
                sm = self.stage_model(btype, beta, c.recompute, c.schedule, kk, c.v)
                i = np.arange(self.n)

                def fits(ln: int) -> bool:  # some range of ln layers fits (monotone in ln)
                    ii = i[: self.n - ln + 1]
                    return bool(sm.cost(ii, ii + ln - 1, smin, c.v)["feasible"].any())

                lo, hi = best, self.n        # fits(lo) known true (or lo = 0), find the largest
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if fits(mid):
                        lo = mid
                    else:
                        hi = mid - 1
                best = max(best, lo)
            self._band[key] = max(best, 1)
        L = self._band[key]
        if math.isfinite(tmax):
            lt = 1
            for btype, kk, beta in kinds:
                sm = self.stage_model(btype, beta, c.recompute, c.schedule, kk, c.v)
                P = sm.PF + (sm.PB if self.train else 0.0)
                jmax = np.searchsorted(P, P[:-1] + tmax * (1 + 1e-12), side="right") - 1
                lt = max(lt, int((jmax - np.arange(self.n)).max()))
            L = max(1, min(L, lt))
        return L

    def stash_of(self, schedule: str, k: int, m: int) -> int:
        """Stashes of a stage with k stages from it to the end of its pipeline (v = 1): a
        function of that k and m for every schedule (bapipe.schedules.stash_count of p = k, d = 0)."""
        return stashes_at(schedule, k, 0, m, 1) if self.train else 0

    def jm_of(self, schedule: str, m: int) -> int:
        """:meth:`jm` of a (schedule, m)."""
        return m * STREAM_K if self.train and schedule == "pipedream" else m

    def cut_bytes_of(self, beta: int) -> np.ndarray:
        """The model's bytes crossing each cut (length n - 1) at ``beta`` samples a replica."""
        return cut_bytes(self.model, self.req.fmt, beta)

    def stage_table(self, btype: str, beta: int, recompute: bool, schedule: str, st: int, L: int) -> np.ndarray:
        """Stage times of every range of at most L layers on one board of ``btype`` (``T[j, l]``:
        layers j-l..j; inf when it does not fit memory with ``st`` stashes), one stage a board,
        kept with :meth:`problem`'s tables (read-only)."""
        key = (btype, 1, beta, recompute, schedule, 1, L, st)
        full = self._stage_times.get(key)
        if full is None:
            n = self.n
            j = np.arange(n)[:, None]
            i = j - np.arange(L)[None, :]
            valid = i >= 0
            ic = np.where(valid, i, 0)
            sm = self.stage_model(btype, beta, recompute, schedule)
            r = sm.cost_of(sm.ranges(ic, np.broadcast_to(j, ic.shape)), float(st), 1)
            full = np.where(valid & r["feasible"], np.broadcast_to(r["time_s"], ic.shape), math.inf)
            self._remember_times(key, full)
        return full

    def _remember_times(self, key: tuple, arr: np.ndarray) -> None:
        """Keep a stage-time table (same board type, fold key, micro-batch, recomputation,
        schedule, chunks, band and stash count give the same table) within STAGE_TIMES_BYTES;
        the oldest go first."""
        arr.setflags(write=False)   # shared by later problems: never changed in place
        self._stage_times[key] = arr
        self._stage_times_bytes += arr.nbytes
        while self._stage_times_bytes > STAGE_TIMES_BYTES and len(self._stage_times) > 1:
            old = next(iter(self._stage_times))
            self._stage_times_bytes -= self._stage_times.pop(old).nbytes

    def problem(self, c: Config, L: int | None = None, tmax: float = math.inf,
                bare: bool = False) -> part.Problem | None:
        """The partition problem of configuration ``c`` (None when a group mixes board types).

        Stage times above ``tmax`` are treated as infeasible (a search bound). ``bare``: a
        relaxation whose least J is a lower bound on that of every placement with the same
        board type and replica count at every position (:meth:`bare_floor`): the stages'
        compute, no all-reduce (X = None), every cut at its floor (:meth:`pair_floor`)."""
        V = c.p * c.v
        L = L or self.band_length(c, tmax)
        n = self.n
        j = np.arange(n)[:, None]
        k = np.arange(L)[None, :]
        i = j - k
        valid = i >= 0
        ic = np.where(valid, i, 0)
        jj = np.broadcast_to(j, ic.shape)
        # stage s -> (board type, stash count); every stash count of a type in one numpy pass
        keys = []
        for s in range(V):
            btype = self.stage_type(c, s % c.p)
            if btype is None:
                return None
            keys.append((btype, self.kd(c, s % c.p), self.beta_at(c, s % c.p), self.stashes(c, s)))
        # stages whose flush and update J exposes after the drain (tail_exposure): the
        # partition problem carries their tails (G) and every stage's backward (W, the drain)
        tails = [self.tails_priced(c, keys[s][0]) and keys[s][1] == 1 for s in range(V)]
        tailed = not bare and any(tails)
        cache: dict = {}
        drains: dict = {}
        for btype, kk, beta in sorted({x[:3] for x in keys}):
            svals = sorted({x[3] for x in keys if x[:3] == (btype, kk, beta)})
            base = (btype, kk, beta, c.recompute, c.schedule, c.v, L)
            # held here before storing new ones: storing may drop the oldest tables, which
            # can be this call's own (gpt2-xl on 64xU55C raised KeyError before)
            have = {st: self._stage_times.get(base + (st,)) for st in svals}
            back = {st: self._stage_times.get(base + (st, "bwd")) for st in svals} if tailed else {}
            todo = [st for st in svals if have[st] is None or (tailed and back[st] is None)]
            if todo:
                sm = self.stage_model(btype, beta, c.recompute, c.schedule, kk, c.v)
                r = sm.cost_of(sm.ranges(ic, jj), np.array(todo, dtype=float)[:, None, None], c.v)
                tt = np.broadcast_to(r["time_s"], (len(todo), n, L))
                full = np.where(valid & r["feasible"], tt, math.inf)
                bw_ = np.where(valid, np.broadcast_to(r["bwd_s"], (len(todo), n, L)), 0.0) if tailed else None
                for q, st in enumerate(todo):
                    have[st] = full[q]
                    self._remember_times(base + (st,), full[q])
                    if tailed:
                        back[st] = bw_[q]
                        self._remember_times(base + (st, "bwd"), bw_[q])
            for st in svals:
                full = have[st]
                cache[(btype, kk, beta, st)] = full if tmax == math.inf else np.where(full <= tmax, full, math.inf)
                if tailed:
                    drains[(btype, kk, beta, st)] = back[st]
        T = [cache[k] for k in keys]
        C = np.zeros((max(V - 1, 0), n))
        O = np.zeros((max(V - 1, 0), n))
        ways = 2 if self.train else 1
        if bare:
            # every cut at its floor: the payload (a floor of the line bytes) over the fastest
            # route between two boards of the two positions' types, no load on it, the least
            # route latency; the piece's share as :meth:`pieces` gives it (fixed by the replica
            # counts). Every placement with these types and replica counts costs no less.
            for s in range(V - 1):
                d1, d2 = s % c.p, (s + 1) % c.p
                bw, lat = self.pair_floor(keys[s][0], keys[s + 1][0])
                r1, r2 = self.reps(c, d1), self.reps(c, d2)
                bw *= max(r1, r2) / (r1 if self._forward(c, d1, d2) else r2)
                O[s] = np.concatenate([self.cut_bytes_at(c, d1) / bw, [0.0]])
                C[s] = ways * (O[s] + lat)
            if self.req.whole_blocks and V > 1:
                C[:, self.open_cuts] = math.inf
                O[:, self.open_cuts] = math.inf
            return part.Problem(n, T, C, O, self.jm(c), c.v)
        X = None
        G = W = None
        if tailed:
            per_d: dict = {}
            G = []
            for s in range(V):
                d = s % c.p
                if tails[s] and d not in per_d:
                    per_d[d] = self.tail_table(c, d, ic, jj, valid, ring=False)
                G.append(per_d[d] if tails[s] else None)
            W = [drains[k] for k in keys]
        if self.train and any(self.reps(c, d) > 1 for d in range(c.p)):
            # every replicated stage all-reduces its gradients after its last backward (on FPGA
            # boards the HLS kernel's ring, fpga_models.allreduce); J charges them all in full
            # (the replay overlaps them with the backward drain)
            X = [None] * V
            for s in range(V):
                d = s % c.p
                r = self.reps(c, d)
                if tails[s]:   # the ring as built; the flush and update: tail_exposure
                    X[s] = self.tail_table(c, d, ic, jj, valid, kernels=False)
                    continue
                if r == 1:
                    X[s] = np.zeros((n, L))
                    continue
                bw, lat = self.ring(self.replica_boards(c, d))
                sm = self.stage_model(keys[s][0], keys[s][2], c.recompute, c.schedule, keys[s][1], c.v)
                W = np.where(valid, sm.PW[jj + 1] - sm.PW[ic], 0.0)
                X[s] = ring_allreduce_s(W, r, bw, lat if s < c.p else 0.0)
            if self.per_mb_allreduce(c):
                # PipeDream all-reduces after every micro-batch, overlapped with compute: the
                # stage's period is max(compute, all-reduce) (Narayanan et al. SOSP'19, 3.1)
                T = [np.maximum(t, x) for t, x in zip(T, X)]
                X = None
        for s in range(V - 1):
            if self.meshy(c):
                # resharding between the two stages' meshes, per cut position (cached)
                tf, tb = self.mesh_cut_times(c, s % c.p, (s + 1) % c.p)
                O[s] = np.maximum(tf, tb)
                C[s] = tf + (tb if self.train else 0.0)
                continue
            bw, lat = self.link(c, s % c.p, (s + 1) % c.p)
            line, extra = self.line_at(c, s % c.p)
            occ = np.concatenate([line / bw, [0.0]])
            O[s] = occ
            C[s] = ways * (occ + lat + np.concatenate([extra, [0.0]]))
        if self.req.whole_blocks and V > 1:
            # a cut that leaves a skip connection open costs infinity: no stage boundary falls
            # inside a residual block (what the RTL and simple links can carry)
            C[:, self.open_cuts] = math.inf
            O[:, self.open_cuts] = math.inf
        return part.Problem(n, T, C, O, self.jm(c), c.v, X, G, W)

    @property
    def open_cuts(self) -> np.ndarray:
        """Boolean mask over cut positions: True where more than one tensor crosses."""
        if getattr(self, "_open_cuts", None) is None:
            n = len(self.model.layers)
            self._open_cuts = np.array([len(self.model.cut_tensors(k)) > 1 for k in range(n - 1)] + [False])
        return self._open_cuts

    def mesh_transfer(self, c: Config, d1: int, d2: int, j: int, backward: bool = False):
        """(time_s, directed board pairs, bytes) of the resharding of the activation after
        layer j from device d1's mesh to d2's (``backward``: its gradient from d2 to d1)."""
        a = [b.name for b in self.stage_boards(c, d1)]
        b = [x.name for x in self.stage_boards(c, d2)]
        lay = self.layouts[j]
        shape = cut_shape(self.model, j, c.beta)
        if backward:
            a, b = b, a
        return self.resharder.transfer(a, b, shape, lay, lay)

    def mesh_piece(self, time_s: float, pairs) -> tuple:
        """A replay piece (directed link ids, busy seconds, latency 0) for a resharding that
        holds the union of its hops' routes for its whole predicted time."""
        ids = sorted({i for a, b in pairs for i in self.hop(a, b)[0]})
        return (tuple(ids), time_s, 0.0)

    def mesh_cut_times(self, c: Config, d1: int, d2: int) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward resharding seconds for every cut position (0 after the last
        layer), for the partition search: per layout and direction, best_transfer of a tiny
        and of a large reference tensor, interpolated linearly in bytes (large transfers are
        bandwidth-bound, so this is close; the chosen cuts are then priced exactly by
        :meth:`mesh_transfer` in the replay)."""
        key = ("mesh", c.k, c.kv, c.r, c.beta, d1, d2, self.train)
        if key not in self._links:
            a = [b.name for b in self.stage_boards(c, d1)]
            b = [x.name for x in self.stage_boards(c, d2)]
            nbytes = np.array(self.model.cut_elements_all + (0,), dtype=float) * self.bpe * c.beta
            tf, tb = np.zeros(self.n), np.zeros(self.n)
            for lay in sorted(set(self.layouts)):
                sel = np.array([x == lay for x in self.layouts[:-1]] + [False])
                for out, (u, w) in ((tf, (a, b)), (tb, (b, a))):
                    if out is tb and not self.train:
                        continue
                    k = max(len(a), len(b))
                    small = self.resharder.transfer(u, w, (k, k), lay, lay)[0]
                    ref = (256 * k, 1024 * k)
                    big = self.resharder.transfer(u, w, ref, lay, lay)[0]
                    slope = (big - small) / (math.prod(ref) * self.bpe - k * k * self.bpe)
                    out[sel] = small + slope * np.maximum(nbytes[sel] - k * k * self.bpe, 0.0)
            self._links[key] = (tf, tb)
        return self._links[key]

    def lower_bound(self, c: Config) -> float:
        """A lower bound on J = (sum T + sum C)/v + sum X + (m v - 1) max(T, O): sum T is at
        least the floor of :meth:`sum_floor` and max T at least floor / V; each cut costs at
        least its cheapest position (C and O); when every position is replicated, the rings
        move at least 2 (r_min - 1)/r_min of all weights at the fastest ring's bandwidth."""
        lb = self._lb.get(c)
        if lb is None:
            tot = self.sum_floor(c)
            V = c.p * c.v
            csum, omax, _rmin, _bw, inv = self.layout_floor(c)
            xs = self.ring_floor(c)
            bott = max(tot / V, omax)
            if inv is not None:
                # stage s computes beta_s samples at no less than the per-sample rate u:
                # sum_s T_s / beta_s >= U, so max_s T_s >= U / sum_s 1 / beta_s
                types = {t for t, _k, _b in self.kinds(c)}
                bott = max(bott, self.rate_floor(types, c.recompute) / inv)
            lb = self._lb[c] = (tot + csum) / c.v + xs + (self.jm(c) * c.v - 1) * bott
        return lb

    def ring_floor(self, c: Config) -> float:
        """A lower bound on J's all-reduce term sum X: when every position is replicated (and
        the rings run once per iteration), the rings move at least 2 (r_min - 1)/r_min of all
        weights at the fastest ring's bandwidth, without hop latency; else 0."""
        _csum, _omax, rmin, bw, _inv = self.layout_floor(c)
        if not (self.train and rmin > 1 and not self.per_mb_allreduce(c)):
            return 0.0
        w = min(float(self.stage_model(t, b, c.recompute, c.schedule, k).PW[-1]) for t, k, b in self.kinds(c))
        return ring_allreduce_s(w, rmin, bw, 0.0)

    def pair_floor(self, t1: str, t2: str) -> tuple[float, float]:
        """(most bandwidth, least latency) of a route from a board of type t1 to another board
        of type t2 ((inf, 0) when there is no such pair): a floor of any cut between positions
        of those types."""
        key = ("pair", t1, t2)
        if key not in self._links:
            bw, lat = 0.0, math.inf
            for a in self.boards:
                for b in self.boards:
                    if a is not b and a.board.name == t1 and b.board.name == t2:
                        _h, pbw, plat = self.cluster.path(a.name, b.name)
                        bw, lat = max(bw, pbw), min(lat, plat)
            self._links[key] = (bw if bw > 0 else math.inf, lat if math.isfinite(lat) else 0.0)
        return self._links[key]

    def bare_floor(self, c: Config, jmax: float = math.inf) -> float:
        """A lower bound on J of a configuration (v = 1, no mesh; explore asks it for
        per-position groups, whose placements are thousands), tighter than
        :meth:`lower_bound` and shared by every placement with the same board type and replica
        count at every position: J >= J* of the bare problem (``problem(bare=True)``: the same
        stage tables, no all-reduce, every cut at its floor; every term of J only grows with
        link and ring costs) + the ring floor (:meth:`ring_floor`; the least of a sum over
        partitions is at least the sum of its terms' least). J* is solved once per (positions'
        board types and replicas, schedule, m, samples, recomputation); when it cannot reach
        ``jmax`` the bound returned is >= jmax (``partition.solve``'s early exit), which is all
        the caller asks."""
        ring = self.ring_floor(c)
        csum = self.layout_floor(c)[0]
        seq = tuple((self.stage_type(c, d), self.reps(c, d)) for d in range(c.p))
        base = ("bare", c.schedule, c.v, c.m, c.beta * c.r, c.recompute, seq)
        out = -math.inf
        # two relaxations: cuts at their floor inside the problem, or free cuts in the
        # problem and this placement's own least cut costs (layout_floor) added outside
        for free, extra in ((False, ring), (True, ring + csum / c.v)):
            need = jmax - extra
            key = base + (free,)
            val, exact = self._links.get(key, (-math.inf, False))
            if not exact and val < need:
                prob = self.problem(c, bare=True)
                if prob is not None and free:
                    prob = replace(prob, C=np.zeros_like(prob.C), O=np.zeros_like(prob.O))
                sol = part.solve(prob, self.sum_floor(c), need) if prob is not None else None
                if sol is not None:
                    # an approximate solve (too many caps) is an upper bound: no bound then
                    val, exact = (sol.objective if sol.exact else -math.inf), True
                elif prob is None or not math.isfinite(need):
                    val, exact = math.inf, True    # nothing fits (mixed types, memory)
                else:
                    val = need                     # J* >= need (solve's early exit): a bound only
                self._links[key] = (val, exact)
            out = max(out, val + extra)
            if out >= jmax:
                break
        return out

    def layout_floor(self, c: Config) -> tuple:
        """The parts of :meth:`lower_bound` fixed by the layout and the samples per replica
        (shared by every schedule, recomputation and m with those): (sum of the cuts' least
        C, largest least O, fewest replicas of a position, fastest ring's bandwidth over the
        positions, sum over virtual stages of 1 / samples per replica or None with a mesh)."""
        key = ("layout_floor",) + self._cfg_key(c) + (c.beta,)
        if key not in self._links:
            V = c.p * c.v
            csum, omax = 0.0, 0.0
            if V > 1 and not self.meshy(c):
                for s in range(V - 1):
                    cmin, omin = self.cut_floor(c, s % c.p, (s + 1) % c.p)
                    csum += cmin
                    omax = max(omax, omin)
            rmin = min(self.reps(c, d) for d in range(c.p))
            bw = max(self.ring(self.replica_boards(c, d))[0] for d in range(c.p)) if rmin > 1 else math.inf
            inv = None if self.meshy(c) else sum(1.0 / self.beta_at(c, s % c.p) for s in range(V))
            self._links[key] = (csum, omax, rmin, bw, inv)
        return self._links[key]

    def rate_floor(self, types, recompute: bool) -> float:
        """Seconds per sample of all layers at the fastest of ``types`` per layer, a lower
        bound linear in the samples (FPGA: work / lanes / clock, the ceiling dropped)."""
        key = ("rate", tuple(sorted(types)), recompute)
        if key not in self._links:
            per = None
            for t in types:
                tb = self.tables[t]
                if tb.measured_f is not None or tb.gpu_f is not None:
                    f, b = layer_times(tb, 1)
                else:
                    f = tb.fwd_work / tb.lanes / tb.board.clock_hz
                    b = tb.bwd_work / tb.lanes / tb.board.clock_hz
                u = f + ((b + (f if recompute else 0.0)) if self.train else 0.0)
                per = u if per is None else np.minimum(per, u)
            self._links[key] = float(per.sum()) if per is not None else 0.0
        return self._links[key]

    def cut_floor(self, c: Config, d1: int, d2: int) -> tuple[float, float]:
        """(least C, least O) of a cut from position d1 to d2 over every cut position."""
        key = ("cutfloor",) + self._cfg_key(c) + (c.beta, d1, d2)
        if key not in self._links:
            bw, lat = self.link(c, d1, d2)
            cb = self.cut_bytes_at(c, d1)   # the payload: a floor of the line bytes (engines.link_transfer)
            if self.req.whole_blocks:
                cb = np.where(self.open_cuts[:-1], math.inf, cb)
            occ = float(cb.min()) / bw if len(cb) else 0.0
            self._links[key] = ((2 if self.train else 1) * (occ + lat), occ)
        return self._links[key]

    # ---- configurations -------------------------------------------------------------------
    def m_candidates(self, r: int, p: int, schedule: str) -> list[int]:
        """Micro-batch counts to try: divisors of the global batch whose size splits over r replicas."""
        if self.req.microbatches is not None:
            ms = [self.req.microbatches]
        else:
            # divisors in O(sqrt G): a scan to G hangs on a huge --global-batch
            small = [d for d in range(1, math.isqrt(self.G) + 1) if self.G % d == 0]
            ms = sorted(set(small) | {self.G // d for d in small})
        out = [m for m in ms if self.G % m == 0 and (self.G // m) % r == 0 and
               (m <= MAX_MICROBATCHES or self.req.microbatches is not None)]
        if schedule == "interleaved":
            out = [m for m in out if m % p == 0]
        if schedule == "2bw" and self.train:
            # 2BW's first op of iteration j + 2 waits for iteration j's weight update, which
            # needs a full 1F1B warm-up of iteration j: m >= p (Narayanan et al. ICML'21)
            out = [m for m in out if m >= p]
        if len(out) > MAX_M_CANDIDATES:  # keep the largest (smallest bubbles) and a spread of the rest
            idx = np.unique(np.round(np.linspace(0, len(out) - 1, MAX_M_CANDIDATES)).astype(int))
            out = [out[i] for i in idx]
        return out

    def configs(self, schedules: list[str], replicas: list[int], recompute: tuple[bool, ...]) -> list[Config]:
        """Every configuration of the search space."""
        out = []
        pairs = [(r, p) for r, p in self.shapes(replicas)]
        pairs = [(r, p, 1) for r, p in pairs] if 1 in self.mesh_sizes() else []
        for k in self.mesh_sizes():
            if k > 1:
                pairs.append((1, self.N // k, k))   # tensor-parallel meshes are not replicated
        for kv in self.mesh_vectors():
            pairs.append((1, len(kv), kv))
        for r, p, k in pairs:
            kv = k if isinstance(k, tuple) else ()
            k = max(kv) if kv else k
            probe = Config("1f1b", 1, r, p, 1, 1, False, k, kv)
            if p > self.n or any(self.stage_type(probe, d) is None for d in range(p)):
                continue
            for sched in (schedules if p > 1 else self.one_stage_schedules(schedules)):
                # v = 3, 4 when interleaved is asked for; under auto v = 2 (the sweep's time budget)
                vs = ((INTERLEAVE_CHUNKS if self.req.schedule == "interleaved" else (2,)) if sched == "interleaved"
                      else (1,))
                for v in vs:
                    if p * v > self.n or (sched == "interleaved" and p == 1):
                        continue
                    for m in self.m_candidates(r, p, sched):
                        for rc in recompute:
                            out.append(Config(sched, v, r, p, m, self.G // m // r, rc, k, kv))
        if 1 in self.mesh_sizes():
            for groups in self.replica_layouts(max(replicas, default=1)):
                p = len(groups)
                ru = self.uniform_r(groups)
                for sched in (schedules if p > 1 else self.one_stage_schedules(schedules)):
                    if sched == "interleaved" or (sched == "2bw" and self.req.schedule == "auto"):
                        # per-position replica counts: one chunk per board; 2BW (flushed) runs
                        # 1F1B's op order with more memory, so under auto it never wins
                        continue
                    for m in self.m_candidates(1, p, sched):
                        if ru and (self.G // m) % ru == 0:
                            continue   # the plain (r, p) configuration, added above
                        if max(len(g) for g in groups) <= self.G // m:   # every replica gets a sample
                            for rc in recompute:
                                out.append(Config(sched, 1, 1, p, m, self.G // m, rc, groups=groups))
        return sorted(set(out), key=_ckey)

    def orders(self) -> list[tuple[int, ...]]:
        """Board orders whose consecutive blocks are the stages' replica groups: topology
        order (a stage's replicas share a host, the pipeline crosses the uplinks) and, with
        several hosts, host-interleaved order (board i of every host in turn: replicas
        spread over hosts, so the all-reduce crosses the uplinks and the pipeline stays
        inside a host). Topology order also starts from every host whose rotation puts other
        boards first, so a plan on fewer boards can use any host's boards."""
        hosts: dict = {}
        for i, cb in enumerate(self.boards):
            hosts.setdefault(cb.host, []).append(i)
        cols = list(hosts.values())
        out = []
        # each order also from every host on (hosts in turn, wrapping): a plan on fewer boards
        # than the cluster has then starts on any host, not always on board 0 (on a
        # heterogeneous cluster the fastest boards may sit anywhere; bench/bench_planner_placement.py)
        seen = set()
        for k in range(len(cols)):
            rot = cols[k:] + cols[:k]
            sig = tuple(tuple(self.boards[b].board.name for b in h) for h in rot)
            if sig in seen:   # a rotation onto hosts of the same boards, in the same turn: the same plans
                continue
            seen.add(sig)
            out.append(tuple(b for h in rot for b in h))
            if len(cols) > 1 and k == 0:   # interleaved from host 0 only (the search's time)
                out.append(tuple(h[i] for i in range(max(map(len, rot))) for h in rot if i < len(h)))
        return list(dict.fromkeys(out))

    def uniform_r(self, groups) -> int:
        """r when ``groups`` is the plain layout (r consecutive boards per position from board
        0 in topology order), else 0."""
        r = len(groups[0])
        ok = all(g == tuple(range(d * r, (d + 1) * r)) for d, g in enumerate(groups))
        return r if ok else 0

    def replica_layouts(self, rmax: int) -> list[tuple[tuple[int, ...], ...]]:
        """Per-position replica groups: every vector (r_1..r_p), r_d <= rmax, sum <= N,
        p <= layers, cut from each of :meth:`orders` as consecutive blocks (positions whose
        boards mix types dropped). Exhaustive up to GROUP_BOARDS boards; beyond, only the
        plain (r, p) shapes of :meth:`shapes` (the vectors grow as 2^N) and, up to
        HIER_BOARDS, the layouts of :meth:`hier_layouts`."""
        if self.N > GROUP_BOARDS:
            return [g for g in self.hier_layouts() + self.dp_layouts() if max(len(x) for x in g) <= rmax]
        every = self.every_placement(rmax)
        if every is not None:
            return every
        out = set()

        def vectors(left: int, p_left: int):
            yield ()
            if p_left == 0:
                return
            for r in range(1, min(left, rmax) + 1):
                for rest in vectors(left - r, p_left - 1):
                    yield (r,) + rest

        vecs = [v for v in vectors(self.N, min(self.n, self.N)) if v]
        for order in self.orders():
            for vec in vecs:
                groups, off = [], 0
                for r in vec:
                    groups.append(tuple(order[off:off + r]))
                    off += r
                g = tuple(groups)
                probe = Config("1f1b", 1, 1, len(g), 1, 1, False, groups=g)
                if all(self.stage_type(probe, d) is not None for d in range(len(g))):
                    out.add(g)
        return sorted(out)

    def every_placement(self, rmax: int) -> list[tuple[tuple[int, ...], ...]] | None:
        """Every placement (planner.placement.placements: each position any non-empty
        single-type group of at most ``rmax`` boards, replicas in topology order, boards left
        idle allowed), one per class of interchangeable boards' pattern; None when the
        patterns x :meth:`placement_pairs` exceed the request's placement limit (PLACE_WORK by
        default; then :meth:`replica_layouts` cuts groups from :meth:`orders`). Sets
        ``placement_exact``."""
        work = self.req.placement_limit if self.req.placement_limit is not None else PLACE_WORK
        lim = work // self.placement_pairs()
        key = ("every", rmax, lim)
        if key not in self._links:
            types = [cb.board.name for cb in self.boards]
            self._links[key] = placements(types, board_classes(self.cluster, self.boards),
                                          min(self.n, self.N), rmax, lim)
        self.placement_exact = self._links[key] is not None
        return self._links[key]

    def placement_pairs(self) -> int:
        """(schedule, micro-batch count) pairs a placement is tried with (:meth:`configs`:
        interleaved has plain shapes only, 2BW none under auto), at least 1: what one more
        placement pattern costs the search, in configurations (x 2 with recomputation)."""
        scheds = [x for x in self.schedules() if x != "interleaved" and not (x == "2bw" and self.req.schedule == "auto")]
        return max(1, sum(len(self.m_candidates(1, 1, x)) for x in scheds))

    def jm(self, c: Config) -> int:
        """The micro-batch count J is computed with: m, or for asynchronous PipeDream (one
        stream that never flushes) m x STREAM_K, J of a stream of STREAM_K iterations, in
        which the fill and drain (the sum term) are paid once: J / STREAM_K tends to
        m x the bottleneck, the steady state the replay ranks (at m = 1, J with m alone
        would be the pipeline's latency, and picked partitions for it)."""
        return c.m * STREAM_K if self.train and c.schedule == "pipedream" else c.m

    def hier_layouts(self) -> list[tuple[tuple[int, ...], ...]]:
        """Replica groups beyond GROUP_BOARDS (up to HIER_BOARDS boards of one type in
        equal hosts): the plans PipeDream's hierarchical DP (planner.peer_pipedream.solve:
        boards in a host, hosts on the network) picks on this explorer's own per-layer
        costs at G / N samples a board, with and without its cut term. Non-uniform replica
        counts and replicas across hosts (e.g. 12-3-1) that the plain shapes cannot
        express; the partition of each layout is then solved exactly (section 5)."""
        if ("hier",) in self._links:   # asked again by the baselines' searches
            return self._links[("hier",)]
        lv = cluster_levels(self.cluster, self.boards) if self.N <= HIER_BOARDS and len(self.tables) == 1 else None
        if lv is None:
            return []
        levels, cols = lv
        g, btype = levels[0].units, next(iter(self.tables))
        out = set()
        # the DP's plans depend on the samples a board computes per minibatch (compute and cut
        # bytes grow with them, the all-reduce does not): powers of 4 up to min(G, 4096), and G / N (PipeDream plans one profiled minibatch per GPU, whatever G is)
        scales = sorted({max(1, self.G // self.N)} | {4 ** k for k in range(7) if 4 ** k <= self.G})
        for beta in scales:
            out |= self._hier_at(beta, levels, cols, g, btype, flat=beta == max(1, self.G // self.N))
        self._links[("hier",)] = sorted(out)
        return self._links[("hier",)]

    def dp_layouts(self) -> list[tuple[tuple[int, ...], ...]]:
        """Replica groups beyond GROUP_BOARDS (up to HIER_BOARDS boards, one board a mesh): the
        layout DP's optimum (planner.layouts, planner.layout_dp: every partition x every vector
        of per-stage replica counts on consecutive blocks of each board order of
        ``layouts.dp_orders``) for every (schedule, m, recomputation) the search tries; its
        own ranges are replayed beside each layout's J-optimal partition, like the
        hierarchical DP's."""
        if not GROUP_BOARDS < self.N <= HIER_BOARDS or self.mesh_sizes() != [1] and 1 not in self.mesh_sizes():
            return []
        key = ("dp_layouts",)
        if key not in self._links:
            got = dp_layouts(self)
            for groups, bounds, _j in got:
                if bounds not in self._hier_bounds.setdefault(groups, []):
                    self._hier_bounds[groups].append(bounds)
            self._links[key] = sorted({g for g, _b, _j in got})
        return self._links[key]

    def _hier_at(self, beta: int, levels, cols, g: int, btype: str, flat: bool = False) -> set:
        """:meth:`hier_layouts` at ``beta`` samples per board per minibatch; ``flat``: also the
        plan of the flat-plan search under the formula (planner.peer_search: a stage's
        replicas on part of several hosts, unevenly), which the two-level DP cannot express."""
        sm = self.stage_model(btype, beta, False, "1f1b")
        PT = sm.PF + sm.PB
        # the DP is O(n^3): beyond HIER_BLOCKS layers it runs on HIER_BLOCKS blocks of
        # consecutive layers of about equal compute (block k ends at last[k])
        if self.n > HIER_BLOCKS:
            q = np.searchsorted(PT[1:], PT[-1] * np.arange(1, HIER_BLOCKS) / HIER_BLOCKS)
            last = np.unique(np.append(np.minimum(q, self.n - 1), self.n - 1))
        else:
            last = np.arange(self.n)
        first = np.concatenate(([0], last[:-1] + 1))
        comp, par = PT[last + 1] - PT[first], sm.PW[last + 1] - sm.PW[first]
        cut = sm.IN[last[:-1] + 1]
        out = set()
        runs = [(cut, peer_solve), (0 * cut, peer_solve)] + ([(cut, flat_search)] if flat else [])
        for cuts, how in runs:
            _t, stages = how(PeerInput(tuple(comp), tuple(par), tuple(cuts)), levels)
            groups = tuple(tuple(cols[b // g][b % g] for b in s.boards) for s in stages)
            out.add(groups)
            # the DP's own ranges are replayed beside the layout's J-optimal partition (search)
            hb = [(int(first[s.first]), int(last[s.last])) for s in stages]
            if hb not in self._hier_bounds.setdefault(groups, []):
                self._hier_bounds[groups].append(hb)
        return out

    def mesh_vectors(self) -> list[tuple[int, ...]]:
        """Requested per-stage mesh sizes (``--mesh 4+1+1+1+1``): they must cover the boards in
        pipeline order with every mesh inside one host."""
        out = []
        for kv in (self.req.meshes or ()):
            if isinstance(kv, int):
                continue
            kv = tuple(int(x) for x in kv)
            ok = sum(kv) == self.N and all(x >= 1 for x in kv)
            off = 0
            for x in kv if ok else ():
                ok = ok and len({cb.host for cb in self.boards[off:off + x]}) == 1
                off += x
            if not ok:
                raise SpecError(None, None, "--mesh", f"expected per-stage mesh sizes summing to {self.N} "
                                                      f"boards, each mesh inside one host, got "
                                                      f"{'+'.join(map(str, kv))}")
            out.append(kv)
        return out

    def kd(self, c: Config, d: int) -> int:
        """Mesh size of pipeline position d under configuration c."""
        return c.kv[d] if c.kv else c.k

    def mesh_ks(self, c: Config) -> list[int]:
        """The distinct mesh sizes of configuration c."""
        return sorted(set(c.kv)) if c.kv else [c.k]

    def meshy(self, c: Config) -> bool:
        """Whether c has a tensor-parallel mesh stage (its cuts are priced as reshardings)."""
        return c.k > 1 or any(x > 1 for x in c.kv)

    def stage_boards(self, c: Config, d: int) -> list:
        """Boards of pipeline position d: its replicas (each a mesh of kd boards)."""
        return [self.boards[i] for i in self.dev_idx(c, d)]

    def stage_type(self, c: Config, d: int) -> str | None:
        """Board type of position d's boards (None when they mix types)."""
        key = (c.r, c.k, c.kv, c.groups, d)
        if key not in self._types:
            types = {cb.board.name for cb in self.stage_boards(c, d)}
            self._types[key] = types.pop() if len(types) == 1 else None
        return self._types[key]

    def mesh_sizes(self) -> list[int]:
        """Tensor-parallel mesh sizes to explore: the requested ones that divide the boards
        and fit inside every host (a mesh's boards share one host, in pipeline order); auto:
        1 and the size of the smallest host."""
        hosts = {}
        for cb in self.boards:
            hosts[cb.host] = hosts.get(cb.host, 0) + 1
        hmin = min(hosts.values())
        ks = [k for k in self.req.meshes if isinstance(k, int)] if self.req.meshes is not None else (1, hmin)
        out = []
        for k in sorted(set(ks)):
            if k == 1 or (self.N % k == 0 and k <= hmin and
                          all(len({cb.host for cb in self.boards[i:i + k]}) == 1 for i in range(0, self.N, k))):
                out.append(k)
            elif self.req.meshes is not None:
                raise SpecError(None, None, "--mesh", f"expected a mesh size dividing {self.N} boards whose meshes "
                                                      f"each lie in one host (smallest host: {hmin}), got {k}")
        return out

    def shapes(self, replicas: list[int]) -> list[tuple[int, int]]:
        """(replicas r, stages p) with p x r <= N boards (the first p x r in topology order):
        a plan may leave boards idle when fewer are faster (links, all-reduce, bubbles).
        Up to 16 boards every shape; beyond, r and p each a divisor of N or a power of two
        (the space grows as N log N otherwise), plus p = n for models with fewer layers."""
        N = self.N
        small = N <= 16
        pick = (lambda x, lim: True) if small else \
            (lambda x, lim: lim % x == 0 or x & (x - 1) == 0 or x == lim)
        out = set()
        for r in replicas:
            if not 1 <= r <= N or not pick(r, N):
                continue
            top = N // r
            for p in range(1, min(top, self.n) + 1):
                if pick(p, top) or p == min(top, self.n):
                    out.add((r, p))
        return sorted(out)

    def one_stage_schedules(self, schedules: list[str]) -> list[str]:
        """Schedules a one-stage plan runs: the requested one (interleaving needs two
        positions), or with auto 1F1B's gradient accumulation (GPipe's takes more memory)."""
        if not self.train:
            return ["gpipe"]
        if self.req.schedule == "auto":
            return [self.single_stage_schedule]
        return [x for x in schedules if x != "interleaved"]

    @property
    def single_stage_schedule(self) -> str:
        """One stage: 1F1B with p = 1 is gradient accumulation (one stash); forward-only: gpipe."""
        return "1f1b" if self.train else "gpipe"

    def tails_priced(self, c: Config, btype: str | None) -> bool:
        """Does a stage of board type ``btype`` pay its flush, all-reduce and update as the HLS
        kernels build them (fpga_models.update)? Training FPGA stages of synchronous schedules
        (the asynchronous ones update per micro-batch, not built in HLS), the table's own
        engines (not a measured profile)."""
        if not self.train or c.schedule in ASYNC or btype is None:
            return False
        table = self.table(btype, c.v)
        return table.board.kind == "fpga" and table.measured_f is None

    def tail_prefix(self, btype: str, v: int, r: int) -> dict:
        """Prefix sums over the layers (length n + 1) of a training stage's tail on board type
        ``btype`` (fpga_models.update.layer_tail, the stage an engine kernel as most are):
        flush and update cycles, and for ``r`` replicas the ring's chunk words and gradient
        arrays (fpga_models.allreduce: its cycles are linear in both)."""
        key = ("tail", btype, v, r)
        if key not in self._links:
            table = self.table(btype, v)
            bpe = self.bpe_of_fmt(self.req.fmt)
            parts = [layer_tail(self.model, k, table.board, bpe, True, table.fold[k][1], table.fold[k][0])
                     for k in range(self.n)]
            z = lambda x: np.concatenate([[0.0], np.cumsum(np.asarray(x, dtype=float))])  # noqa: E731
            self._links[key] = {"flush": z([t.flush for t in parts]), "update": z([t.update for t in parts]),
                                "words": z([sum(ar_model.chunk_words(g, r) for g in t.grads) for t in parts]),
                                "arrays": z([len(t.grads) for t in parts])}
        return self._links[key]

    def tail_table(self, c: Config, d: int, ic: np.ndarray, jj: np.ndarray, valid: np.ndarray,
                   ring: bool = True, kernels: bool = True) -> np.ndarray:
        """Seconds of a stage's tail at position d for every range [ic, jj] of the partition
        problem (0 where not ``valid``): the per-layer prefix sums of :meth:`tail_prefix`, the
        flush and update (``kernels``) and the ring over position d's replicas (``ring``,
        fpga_models.allreduce)."""
        btype = self.stage_type(c, d)
        r = self.reps(c, d)
        pre = self.tail_prefix(btype, c.v, r)
        board = self.table(btype, c.v).board
        clk = board.clock_hz
        rng = lambda a: a[jj + 1] - a[ic]  # noqa: E731
        cyc = rng(pre["flush"]) + rng(pre["update"]) if kernels else np.zeros(np.shape(ic))
        if r > 1 and ring:
            bw, lat = self.ring(self.replica_boards(c, d))
            one = ar_model.ring_timing([1], r, bw / clk, max(1, round(lat * clk)), bank_Bps(board) / clk)
            arrays = rng(pre["arrays"])
            ring = ar_model.ring_cycles(rng(pre["words"]), arrays, r, one.ii_rs, one.ii_ag, one.latency)
            cyc = cyc + np.where(arrays > 0, ring, 0.0)
        return np.where(valid, cyc / clk, 0.0)

    def tail_exposure(self, c: Config, bounds) -> float:
        """What J adds for the stages' flush and update kernels (fpga_models.update): they run
        after a stage's last backward, while the stages before it still drain theirs, so stage
        s shows max(0, its flush and update - the backward of one micro-batch of every stage
        before it); the iteration waits for the largest. (Summed in full, as J charges rings,
        they misranked schedules whose drain hides the FC stage's update: vgg16's eager 1F1B
        at m = 8 replays 6% faster than the gpipe plan J preferred.) 0 when not priced."""
        out, drain = 0.0, 0.0
        one = np.array([[True]])
        for s, (a, b) in enumerate(bounds):
            d = s % c.p
            btype = self.stage_type(c, d)
            if self.tails_priced(c, btype) and self.kd(c, d) == 1:
                t = float(self.tail_table(c, d, np.array([[a]]), np.array([[b]]), one, ring=False)[0, 0])
                out = max(out, t - drain)
            if btype is not None:
                sm = self.stage_model(btype, self.beta_at(c, d), c.recompute, c.schedule, self.kd(c, d), c.v)
                r = sm.cost(np.array([a]), np.array([b]), float(self.stashes(c, s)), c.v)
                drain += float(np.asarray(r["bwd_s"]).reshape(-1)[0]) if "bwd_s" in r else 0.0
        return out

    def stage_tails(self, c: Config, stages: list[dict]) -> list[Tail | None]:
        """Per stage of a finished candidate its tail as the kernels build it
        (fpga_models.update.stage_tail: its board, style, folding and replica ring; the flush its
        tiled backward engines', :meth:`flush_s`), None where it is not priced (:meth:`tails_priced`)."""
        out: list[Tail | None] = []
        for x in stages:
            if not self.tails_priced(c, x["board_type"]) or x["mesh"] > 1:
                out.append(None)
                continue
            board = self.table(x["board_type"], c.v).board
            hop = self.ring(self.replica_boards(c, x["device"])) if x["replicas"] > 1 else None
            out.append(stage_tail(self.model, x["first"], x["last"], board, self.bpe_of_fmt(self.req.fmt),
                                  x["replicas"], engine_kernel(self.model, x["first"], x["last"]), x["folding"], hop,
                                  flush=self.flush_s(c, x) * board.clock_hz))
        return out

    def per_mb_allreduce(self, c: Config) -> bool:
        """Whether replicated stages all-reduce after every micro-batch (PipeDream), not once
        per iteration."""
        return self.train and c.schedule == "pipedream"

    def schedules(self) -> list[str]:
        """Schedules to explore."""
        if not self.train:
            return ["gpipe"]
        if self.req.schedule == "auto":
            # synchronous schedules only: PipeDream-2BW trains with one step of weight
            # staleness, which changes what the user trains, so it runs only when asked for
            return [x for x in SCHEDULES if x not in ASYNC_SCHEDULES]
        return [self.req.schedule]

    # ---- search ---------------------------------------------------------------------------
    def solve_config(self, c: Config, jmax: float = math.inf) -> Candidate | None:
        """Exact partition of one configuration (None if nothing fits, or nothing beats ``jmax``)."""
        if c.v == 1 and c.p > 1 and c.schedule != "1f1b" and not (
                self.per_mb_allreduce(c) and any(self.reps(c, d) > 1 for d in range(c.p))) and all(
                self.tails_priced(c, t) == self.tails_priced(replace(c, schedule="1f1b"), t)
                for t in {self.stage_type(c, d) for d in range(c.p)}):
            # J does not depend on the schedule when v = 1 except through memory (PipeDream's
            # also through its per-micro-batch all-reduce, so only without replicas); 1F1B
            # stashes the least (and 2BW's second weight copy only adds memory), so no
            # partition does better under another schedule (where both price the same tails: a
            # slower backward lengthens the drain, which hides at most what it adds to the
            # sum, so J still only grows): 1F1B's optimum is also theirs
            # whenever it still fits, and when 1F1B has nothing below jmax neither do they
            base = self.solve_config(replace(c, schedule="1f1b"), jmax)
            if base is None:
                return None
            if base is not None:
                mine = self.fixed_config(c, base.bounds)
                if mine is not None and abs(mine.objective - base.objective) <= 1e-12 * base.objective:
                    mine.exact = base.exact
                    return mine
        if c in self._solved:
            cand = self._solved[c]
            return Candidate(c, list(cand.bounds), cand.objective, cand.exact) if cand else None
        # a partition with J <= jmax has every stage time <= jmax / (m v - 1 + 1/v)
        tmax = jmax / (self.jm(c) * c.v - 1 + 1 / c.v) if math.isfinite(jmax) else math.inf
        if not self.may_fit(c, tmax):
            if not math.isfinite(tmax):
                self._solved[c] = None
            return None
        prob = self.problem(c, tmax=tmax)
        sol = part.solve(prob, self.sum_floor(c), jmax) if prob is not None else None
        # J: the partition problem's, the flush and update kernels the drain does not hide included
        cand = Candidate(c, sol.bounds, sol.objective, sol.exact) if sol else None
        if cand is not None or not math.isfinite(tmax):
            self._solved[c] = cand   # a bounded miss may succeed under a looser bound: not cached
        return Candidate(c, list(cand.bounds), cand.objective, cand.exact) if cand else None

    def may_fit(self, c: Config, tmax: float = math.inf) -> bool:
        """A quick necessary condition for a partition to exist: greedy left-to-right packing
        under monotone relaxations of the constraints (compute <= tmax, memory with every
        stage's own stash count; with recomputation the stage input is bounded below by the
        smallest cut), stages allowed to stay empty. Both relaxed costs only grow when a range
        grows, so greedy packing (each stage as far as it goes) covers the layers whenever any
        partition does; False means provably infeasible."""
        pos = 0
        for s in range(c.p * c.v):
            btype = self.stage_type(c, s % c.p)
            if btype is None:
                return False
            beta, kk, st = self.beta_at(c, s % c.p), self.kd(c, s % c.p), self.stashes(c, s)
            # the relaxed memory prefix of a (stage model, stash count), kept: 64-stage plans
            # ask for the same few thousands of times (GPT-3 175B on 64xU55C)
            qkey = ("fitq", btype, beta, c.recompute, memory_key(c.schedule), kk, c.v, st)
            if qkey not in self._links:
                sm = self.stage_model(btype, beta, c.recompute, c.schedule, kk, c.v)
                cap = sm.capacity / c.v
                if self.train and c.recompute:
                    Q = sm.PW * sm.weight_copies_at(st) + sm.PA + sm.PBUF
                    cap -= st * float(sm.IN.min())
                elif self.train:
                    Q = sm.PW * sm.weight_copies_at(st) + st * sm.PA + sm.PBUF
                else:
                    Q = sm.PW * sm.copies + sm.PA + sm.PBUF
                self._links[qkey] = (Q, cap * (1 + 1e-12), sm.PF + (sm.PB if self.train else 0.0))
            Q, capx, P = self._links[qkey]
            jm = int(np.searchsorted(Q, Q[pos] + capx, side="right")) - 1   # last prefix index
            if math.isfinite(tmax):
                jt = int(np.searchsorted(P, P[pos] + tmax * (1 + 1e-12), side="right")) - 1
                jm = min(jm, jt)
            # a stage that cannot take the next layer is left empty in the relaxation: a
            # later stage (another board type, fewer stashes) may take it, and a partition
            # whose stages are all non-empty covers no more than one allowing empty ones
            pos = max(pos, jm)
            if pos >= self.n:
                return True
        return pos >= self.n

    def sum_floor(self, c: Config) -> float:
        """A lower bound on a partition's sum of stage times: every layer's compute on the
        fastest (board type, mesh, samples per replica) the configuration's stages have
        (a stage's time is at least its layers' compute)."""
        kinds = self.kinds(c)
        key = ("floor", kinds, c.recompute, memory_key(c.schedule), c.v)
        if key not in self._links:
            per = None
            for btype, kk, beta in kinds:
                sm = self.stage_model(btype, beta, c.recompute, c.schedule, kk, c.v)
                t = np.diff(sm.PF) + (np.diff(sm.PB) if self.train else 0.0)
                per = t if per is None else np.minimum(per, t)
            self._links[key] = float(per.sum())
        return self._links[key]

    def kinds(self, c: Config) -> tuple:
        """Distinct (board type, mesh size, samples per replica) of the configuration's positions
        (mixed-type positions are skipped: such a configuration has no partition)."""
        key = (c.r, c.k, c.kv, c.groups, c.p, c.beta)
        if key not in self._kinds:
            out = set()
            for d in range(c.p):
                t = self.stage_type(c, d)
                if t is not None:
                    out.add((t, self.kd(c, d), self.beta_at(c, d)))
            self._kinds[key] = tuple(sorted(out))
        return self._kinds[key]

    def fixed_config(self, c: Config, bounds: list[tuple[int, int]]) -> Candidate | None:
        """A user- or baseline-given partition of one configuration (None if it does not fit)."""
        J = self.objective(c, bounds)
        if not math.isfinite(J):
            return None
        return Candidate(c, list(bounds), J)

    def objective(self, c: Config, bounds: list[tuple[int, int]]) -> float:
        """J of one partition of configuration c (inf when a stage does not fit): the same
        figures :meth:`problem` tabulates and partition.evaluate combines, computed for the
        given ranges only (O(stages) instead of O(stages x n x L))."""
        V = c.p * c.v
        if len(bounds) != V:
            return math.inf
        ts, xs, cs, os_ = [], [], [], []
        meshy = self.meshy(c)
        for s, (a, b) in enumerate(bounds):
            d = s % c.p
            btype = self.stage_type(c, d)
            if btype is None:
                return math.inf
            beta = self.beta_at(c, d)
            sm = self.stage_model(btype, beta, c.recompute, c.schedule, self.kd(c, d), c.v)
            r = sm.cost(np.array([a]), np.array([b]), float(self.stashes(c, s)), c.v)
            if not bool(r["feasible"][0]):
                return math.inf
            ts.append(float(r["time_s"][0]))
            rr = self.reps(c, d)
            if self.tails_priced(c, btype) and self.kd(c, d) == 1:
                if rr > 1:   # the ring as built (as problem())
                    one = np.array([[True]])
                    xs.append(float(self.tail_table(c, d, np.array([[a]]), np.array([[b]]), one, kernels=False)[0, 0]))
            elif self.train and rr > 1:
                bw, lat = self.ring(self.replica_boards(c, d))
                W = float(sm.PW[b + 1] - sm.PW[a])
                x = ring_allreduce_s(W, rr, bw, lat if s < c.p else 0.0)
                if self.per_mb_allreduce(c):
                    ts[-1] = max(ts[-1], x)   # overlapped per micro-batch (see problem)
                else:
                    xs.append(x)
            if s < V - 1:
                if self.req.whole_blocks and self.open_cuts[b]:
                    return math.inf
                if meshy:
                    tf, tb = self.mesh_cut_times(c, d, (s + 1) % c.p)
                    os_.append(float(max(tf[b], tb[b])))
                    cs.append(float(tf[b] + (tb[b] if self.train else 0.0)))
                else:
                    bw, lat = self.link(c, d, (s + 1) % c.p)
                    line, extra = self.line_at(c, d)
                    occ = float(line[b]) / bw
                    os_.append(occ)
                    cs.append((2 if self.train else 1) * (occ + lat + float(extra[b])))
        total = sum(ts) + sum(cs) + c.v * sum(xs)
        return total / c.v + (self.jm(c) * c.v - 1) * max(ts + os_) + self.tail_exposure(c, bounds)

    def explore(self, configs: list[Config], slack: float = SLACK) -> list[Candidate]:
        """Exact partitions of the configurations in lower-bound order, sorted by J: every
        configuration whose J is within ``slack`` of the least J has its optimum in the list
        (the others are skipped once their bound exceeds (1 + slack) x the best J so far)."""
        found: list[Candidate] = []
        best = math.inf
        order = sorted(configs, key=lambda c: (self.lower_bound(c), _ckey(c)))
        depths: set = set()
        for c in order:
            lb = self.lower_bound(c)
            if lb >= best * (1 + DEPTH_SLACK):
                break
            # J prices FPGA stages time-multiplexed; the replay may run them as dataflow
            # pipelines, which favours few deep stages: until a pipeline depth has a
            # candidate (per depth and boards used), its configurations are kept up to
            # DEPTH_SLACK above the best J
            shape = (c.p, self.boards_used(c))
            if c.groups and c.groups not in self._hier_bounds:
                # per-position groups: hundreds of near-equal vectors; only those whose bound is
                # near the best J are solved (the least J stays exact: slack only widens the set)
                lim = best * (1 + min(slack, GROUP_SLACK))
            elif c.groups:
                # the layout DP's and the hierarchical DP's few proposals: solved (and their own
                # ranges replayed) within the replay's slack, since J does not rank them exactly
                lim = best * (1 + slack)
            else:
                lim = best * (1 + (slack if shape in depths else max(slack, DEPTH_SLACK)))
            if lb >= lim:
                continue
            if c.groups and c.v == 1 and self.placement_exact and self.bare_floor(c, lim) >= lim:
                # what solve_config(c, lim) would find (nothing under lim), from a bound shared
                # by every placement with the same board types and replica counts (thousands
                # when every placement is searched; with the orders' or the hierarchical DP's
                # few layouts the shared solves cost more than they save: sweep 63.9 -> 92.4 s)
                continue
            cand = self.solve_config(c, lim)
            if cand is None:
                continue
            found.append(cand)
            depths.add(shape)
            best = min(best, cand.objective)
        found.sort(key=lambda x: (x.objective, _ckey(x.config)))
        return found

    def search(self, configs: list[Config], slack: float = SLACK) -> list[Candidate]:
        """Exact partitions of the configurations in bound order; replayed fastest first.

        J approximates the replayed time (GPipe's replay is at most J, 1F1B's may exceed it
        by the round-trip stalls), so configurations within SLACK of the best J are kept and
        replayed in J order until J exceeds the best replayed time by SLACK.
        """
        found = self.explore(configs, slack)
        # replay the best few per schedule (schedules share J when v = 1 but not their
        # replayed time), skipping candidates identical to one already replayed
        best_j = found[0].objective if found else math.inf
        per: dict[str, int] = {}
        seen: set = set()
        done, rest = [], []
        depth: set = set()
        for cand in found:
            c = cand.config
            key = (c.schedule, c.v, c.r, c.p, c.groups, c.beta * c.m, c.recompute, tuple(cand.bounds)) if c.p == 1 \
                else (c, tuple(cand.bounds))
            # J prices FPGA stages time-multiplexed while the replay may use the faster
            # dataflow style (section 2), which favours few deep stages: the best candidate
            # of every (pipeline depth, boards used) that explore kept is replayed too
            regular = per.get((c.schedule, c.k, c.kv), 0) < MAX_REPLAYS and cand.objective <= best_j * (1 + slack)
            shape = (c.p, self.boards_used(c))
            if (regular or shape not in depth) and key not in seen:
                seen.add(key)
                depth.add(shape)
                if regular:
                    per[(c.schedule, c.k, c.kv)] = per.get((c.schedule, c.k, c.kv), 0) + 1
                self.finish(cand)
                done.append(cand)
            else:
                rest.append(cand)
        tried: set = set()
        for cand in found:
            # a hierarchical layout (hier_layouts): the best-J configuration of each layout
            # and schedule also replays the DP's own ranges, since J, which picked the
            # partition, is not the replay
            c = cand.config
            if c.groups not in self._hier_bounds or (c.groups, c.schedule) in tried:
                continue
            tried.add((c.groups, c.schedule))
            for hb in self._hier_bounds[c.groups]:
                if hb != cand.bounds and (c, tuple(hb)) not in seen:
                    seen.add((c, tuple(hb)))
                    alt = self.fixed_config(c, hb)
                    if alt is not None:
                        self.finish(alt)
                        done.append(alt)
        done.sort(key=lambda x: (x.iteration_s, x.objective, x.config))
        done = self.polish(done, seen)
        return done + rest

    def polish(self, done: list[Candidate], seen: set) -> list[Candidate]:
        """The replayed winner's layout and partition, and the hierarchical DP's own plans
        (:meth:`hier_layouts`), replayed at every micro-batch count (and recomputation) of the
        winner's schedule: J picks m by a closed form that the replay can disagree with
        (VGG-16 on 16xV100, G = 128, asynchronous PipeDream: J chose m = 4 for the 12-3-1
        layout, whose replay at m = 1 is 6% faster). Returns ``done`` re-sorted."""
        if not done or not self.train:
            return done
        win = done[0].config
        if win.v != 1 or self.meshy(win):
            return done
        plans = [(self.layout_of(win), tuple(done[0].bounds))]
        for groups, hbs in self._hier_bounds.items():
            plans += [(groups, tuple(hb)) for hb in hbs]
        plans = list(dict.fromkeys(plans))
        for groups, bounds in plans:
            done += self.variants(groups, bounds, [win.schedule], seen, win.m, len(plans))
        done.sort(key=lambda x: (x.iteration_s, x.objective, x.config))
        return done

    def retune(self, best: Candidate) -> Candidate:
        """The final plan's boards and partition replayed under every schedule the request
        allows (one chunk a board), at every micro-batch count and recomputation, then its cuts
        moved a layer at a time while a move replays faster (:meth:`nudge`), re-swept after each
        move, within NUDGE_WORK replays. The plan may come from a baseline
        (planning.baselines_of) that the search's J ranked below its own picks, J ranks
        schedules by a closed form, and the partition DP is exact for J, not for the replay:
        VGG-16 on 4xU250-ring planned gpipe 16 x 2 at 1.185 s; retuned, eager-1F1B 16 x 2 on
        0-9,10-19,20-28,29-36 at 1.061 s."""
        c = best.config
        if not self.train or c.v != 1 or self.meshy(c):
            return best
        scheds = [s for s in self.schedules() if s != "interleaved"]
        work = 0
        while work < NUDGE_WORK:   # a moved cut gets its own best schedule and micro-batching
            best, configs = self.sweep(best, scheds)
            work += len(configs)
            moved, work = self.nudge(best, configs[:NUDGE_CONFIGS], work)
            if moved is None:
                break
            best = moved
        return best

    def sweep(self, best: Candidate, scheds: list[str]) -> tuple[Candidate, list[Config]]:
        """``best``'s boards and partition replayed under ``scheds`` at every micro-batch count
        and recomputation: the fastest, and the distinct configurations fastest first."""
        c = best.config
        alts = self.variants(self.layout_of(c), tuple(best.bounds), scheds, {(c, tuple(best.bounds))}, c.m, 1)
        ranked = sorted([best] + alts, key=lambda x: (x.iteration_s, x.config))
        return ranked[0], list(dict.fromkeys(x.config for x in ranked))

    def nudge(self, best: Candidate, configs: list[Config], work: int) -> tuple[Candidate | None, int]:
        """The first move of one cut by one layer (cuts in order) that replays faster than ``best``
        under one of ``configs`` (the fastest schedules, micro-batch counts and recomputations of
        its partition), and the replays spent; None when no move is faster, the NUDGE_WORK
        replays are spent or the pipeline is deeper than NUDGE_STAGES. The partition DP is exact
        for J, not for the replay (VGG-16 on 4xU250-ring: J's optimum 0-9,10-18,19-27,28-36
        replays 1.17 s under 1F1B 32 x 1, while 0-9,10-19,20-29,30-36 replays 1.061 s under
        eager-1F1B 16 x 2)."""
        p = best.config.p
        if p < 2 or p > NUDGE_STAGES or len(best.bounds) != p:
            return None, work
        for k in range(p - 1):
            for step in (-1, 1):
                b = [list(x) for x in best.bounds]
                b[k][1] += step
                b[k + 1][0] += step
                if b[k][1] < b[k][0] or b[k + 1][0] > b[k + 1][1]:
                    continue
                for c in configs:
                    if work >= NUDGE_WORK:
                        return None, work
                    work += 1
                    cand = self.fixed_config(c, [tuple(x) for x in b])
                    if cand is None:
                        continue
                    self.finish(cand)
                    if (cand.iteration_s, cand.config) < (best.iteration_s, best.config):
                        return cand, work
        return None, work

    def layout_of(self, c: Config) -> tuple[tuple[int, ...], ...]:
        """The boards of each pipeline position of ``c`` (its replicas in ring order)."""
        return tuple(self.dev_idx(c, d) for d in range(c.p))

    def variants(self, groups, bounds, schedules: list[str], seen: set, m0: int, plans: int) -> list[Candidate]:
        """Replayed candidates of one layout and partition at every micro-batch count and
        recomputation of ``schedules`` (those near ``m0`` only when ``plans`` such sweeps would
        exceed POLISH_WORK replays); ``seen`` (config, bounds) pairs are skipped and added to."""
        p, out = len(groups), []
        if len(bounds) != p:
            return out
        for sched in schedules:
            ms = self.m_candidates(1, p, sched)
            if plans * len(ms) * 2 * len(schedules) > POLISH_WORK:   # huge batches: m near the winner's only
                ms = [m for m in ms if m0 / POLISH_SPAN <= m <= m0 * POLISH_SPAN]
            for m in ms:
                if max(len(g) for g in groups) > self.G // m:
                    continue
                for rc in (False, True):
                    c = Config(sched, 1, 1, p, m, self.G // m, rc, groups=groups)
                    if groups == tuple((d,) for d in range(p)):
                        c = replace(c, groups=())   # one board a position in topology order: the plain layout
                    if (c, bounds) in seen or any(self.stage_type(c, d) is None for d in range(p)):
                        continue
                    seen.add((c, bounds))
                    cand = self.fixed_config(c, list(bounds))
                    if cand is not None:
                        self.finish(cand)
                        out.append(cand)
        return out

    # ---- details ---------------------------------------------------------------------------
    @staticmethod
    def replayed(fn, c: Config) -> float:
        """``fn(m)`` (a replay of m micro-batches), exactly up to 2 x REPLAY_M micro-batches;
        beyond, extrapolated linearly from m1 and 2 m1 (m1 <= REPLAY_M, a multiple of p for
        interleaving): once its warm-up is over a replay of identical micro-batches repeats
        a fixed pattern, so its time grows by the same amount per micro-batch (the replay is
        O(m p) and --global-batch 100000 would replay 10^5 micro-batches per candidate)."""
        if c.m <= 2 * REPLAY_M:
            return fn(c.m)
        m1 = REPLAY_M - REPLAY_M % c.p if c.schedule == "interleaved" else REPLAY_M
        m1 = max(m1, c.p)
        t1, t2 = fn(m1), fn(2 * m1)
        return t2 + (c.m - 2 * m1) * (t2 - t1) / m1

    def flush_s(self, c, x: dict) -> float:
        """Seconds of stage ``x``'s backward flush call (fpga_models.bwd_memory.bwd_flush_cycles), once an
        iteration; 0 off FPGAs."""
        table = self.table(x["board_type"], c.v)
        if table.board.kind != "fpga" or x["style"] == "gpu":
            return 0.0
        port = x.get("port_lanes")
        key = ("flush", x["first"], x["last"], x["board_type"], x["beta"], c.m, x["style"], c.v, port)
        if key not in self._links:
            lyr = list(self.model.layers[x["first"]:x["last"] + 1])
            fold = {k: tuple(v) for k, v in x["folding"].items()}
            room = (self.bwd_room(x["first"], x["last"], x["board_type"], c.v, port)
                    if x["style"] == "time-multiplexed" else None)
            self._links[key] = bwd_flush_cycles(self.model, lyr, table.board, fold, self.req.fmt, x["style"],
                                                x["beta"], c.m * x["beta"], room)
        return self._links[key] / table.board.clock_hz

    def port_lanes(self, c: Config, s: int, bounds) -> int | None:
        """Lanes of stage ``s``'s input port: the previous stage's last layer's output beat at its
        table's folding (fpga_models.allocate.stage_port_lanes); None for the first stage."""
        if s == 0:
            return None
        a = bounds[s][0]
        btype = self.stage_type(c, (s - 1) % c.p)
        table = self.table(btype, c.v) if btype is not None else None
        if table is None or table.board.kind != "fpga":
            return None
        return stage_port_lanes(self.model.layers[a - 1], table.fold[a - 1])

    def bwd_room(self, a: int, b: int, btype: str, v: int, port: int | None):
        """The blocks a time-multiplexed stage's backward kernel may take beside its forward
        kernel (fpga_models.allocate.bwd_block_room), at the table's folding; cached."""
        key = ("room", a, b, btype, v, port)
        if key not in self._links:
            table = self.table(btype, v)
            lyr = list(self.model.layers[a:b + 1])
            fold = {l.name: table.fold[a + k] for k, l in enumerate(lyr)}
            self._links[key] = bwd_block_room(lyr, table.board, fold, self.req.fmt, self.req.cap, v, port)
        return self._links[key]

    def finish(self, cand: Candidate) -> Candidate:
        """Per-stage figures, all-reduce, and the replayed iteration time of a candidate."""
        c = cand.config
        V = c.p * c.v
        stages = []
        for s, (a, b) in enumerate(cand.bounds):
            d = s % c.p
            btype = self.stage_type(c, d)
            beta = self.beta_at(c, d)
            cb = self.cut_bytes_at(c, d)
            sm = self.stage_model(btype, beta, c.recompute, c.schedule, self.kd(c, d), c.v)
            st = self.stashes(c, s)
            r = {k: float(np.asarray(v)) for k, v in sm.cost(np.array(a), np.array(b), st, c.v).items()}
            table = self.table(btype, c.v)
            fold = {self.model.layers[x].name: table.fold[x] for x in range(a, b + 1)}
            style = "gpu" if table.board.kind == "gpu" else "time-multiplexed"
            rtl_b = r["bwd_s"]   # the training RTL's backward (only the allocated FPGA stages differ)
            port = self.port_lanes(c, s, cand.bounds) if table.board.kind == "fpga" else None
            if table.board.kind == "fpga" and table.measured_f is None and self.kd(c, d) == 1:
                # candidates share stages (same range, board type, samples and chunks): allocate once
                akey = ("alloc", a, b, btype, beta, c.v)
                if akey not in self._links:
                    self._links[akey] = allocate_stage(list(self.model.layers[a:b + 1]), table.board, self.req.fmt,
                                                       beta, self.req.cap, self.train, chunks=c.v,
                                                       no_dx=no_input_gradient(self.model))
                alloc = self._links[akey]
                if alloc.style == "dataflow":
                    # the layer-pipelined engines are faster: same memory and spill traffic
                    cf = alloc.fwd_s
                    bwd_s = alloc.bwd_s
                    if self.train:   # the backward's tiled engines as built (fpga_models.bwd_tiles)
                        dkey = ("dfbwd", a, b, btype, beta, c.v, c.m)
                        if dkey not in self._links:
                            self._links[dkey] = dataflow_bwd_cycles(
                                self.model, list(self.model.layers[a:b + 1]), table.board, dict(alloc.folding),
                                self.req.fmt, beta, c.m * beta)
                        bwd_s = self._links[dkey] / table.board.clock_hz
                    cb_ = bwd_s + (cf if c.recompute and self.train else 0.0)
                    r["fwd_s"] = max(cf, r["traffic_f"])
                    r["bwd_s"] = max(cb_, r["traffic_b"]) if self.train else 0.0
                    # the training RTL's per-layer engines (fpga_models.engines, allocate.dataflow): no tiles
                    rtl_b = max(alloc.bwd_s + (cf if c.recompute else 0.0), r["traffic_b"]) if self.train else 0.0
                    r["time_s"] = r["fwd_s"] + r["bwd_s"]
                    r["compute_f"], r["compute_b"] = cf, cb_
                    fold, style = dict(alloc.folding), "dataflow"
                else:
                    # frame buffers beyond the forward kernel's on-chip share go off chip (the
                    # lowering's rule, fpga_models.allocate): a turn waits on their 512-bit words
                    # and a turn fetching off-chip weights waits on their words (codegen.design.weight_memory)
                    skey = ("spill", a, b, btype, c.v, port)   # fold is the table's, fixed by (btype, v)
                    if skey not in self._links:
                        lyr = list(self.model.layers[a:b + 1])
                        self._links[skey] = (
                            tm_spill_cycles(lyr, table.board, fold, self.req.fmt, self.req.cap, c.v, self.train,
                                            port_lanes=port)
                            + tm_weight_cycles(lyr, table.board, fold, self.req.fmt, self.req.cap, c.v, self.train,
                                               port))
                    spill = self._links[skey] * beta / table.board.clock_hz
                    r["compute_f"] += spill
                    # its weight loads share one bundle, so one bank: at least that bank's time
                    wkey = ("wbank", a, b, btype, c.v)
                    if wkey not in self._links:
                        self._links[wkey] = tm_weight_bank_seconds(list(self.model.layers[a:b + 1]), table.board, fold,
                                                                   self.req.fmt, self.req.cap, c.v, self.train)
                    r["fwd_s"] = max(r["compute_f"], r["traffic_f"], self._links[wkey] * beta)
                    if c.recompute and self.train:   # the recomputed forward waits on them too
                        r["compute_b"] += spill
                    # the training RTL's turns: its per-layer engines, no HLS frames off chip nor tiled engines
                    rtl_b = max(r["compute_b"], r["traffic_b"]) if self.train else 0.0
                    if self.train:   # and the backward kernel's turns on its off-chip frames and weight tile fills
                        bkey = ("bspill", a, b, btype, c.v, c.m * beta, port)
                        if bkey not in self._links:
                            lyr = list(self.model.layers[a:b + 1])
                            self._links[bkey] = tm_bwd_extra_cycles(
                                self.model, lyr, table.board, fold, self.req.fmt,
                                kernel_onchip_budget(table.board, self.req.cap, c.v, True), c.m * beta,
                                self.bwd_room(a, b, btype, c.v, port))
                        r["compute_b"] += self._links[bkey] * beta / table.board.clock_hz
                        r["bwd_s"] = max(r["compute_b"], r["traffic_b"])
                    r["time_s"] = r["fwd_s"] + r["bwd_s"]
            if s < V - 1 and self.meshy(c):
                occ, lat, sb = self.mesh_transfer(c, d, (s + 1) % c.p, b)[0], 0.0, int(cb[b])
            elif s < V - 1:
                bw, lat = self.link(c, d, (s + 1) % c.p)
                line, extra = self.line_at(c, d)
                occ, sb, lat = float(line[b]) / bw, int(cb[b]), lat + float(extra[b])
            else:
                occ, lat, sb = 0.0, 0.0, 0
            stages.append({"index": s, "device": d, "chunk": s // c.p, "first": a, "last": b, "board_type": btype,
                           "boards": [x.name for x in self.stage_boards(c, d)], "fwd_s": r["fwd_s"],
                           "bwd_s": r["bwd_s"], "bwd_rtl_s": rtl_b,
                           "time_s": r["time_s"], "memory_bytes": int(r["memory"]), "weight_bytes": int(r["weight_bytes"]),
                           "stash_bytes": int(r["stash_bytes"]), "stashes": st,
                           "stash_mb_bytes": int(r["stash_mb"]), "fixed_bytes": int(r["fixed_bytes"]), "send_bytes": sb, "send_occ": occ,
                           "send_lat": lat, "send_s": occ + lat, "compute_f": r["compute_f"],
                           "compute_b": r["compute_b"], "onchip": sm.onchip, "folding": fold, "style": style,
                           "mesh": self.kd(c, d), "layout": self.layouts[b] if self.meshy(c) else None,
                           "port_lanes": port,
                           "replicas": self.reps(c, d), "beta": beta})
        ar = [0.0] * V          # per stage (chunk): its own ring after its last backward
        tails = self.stage_tails(c, stages)   # FPGA stages: flush, ring and update as built
        if self.train:
            for x in stages:
                if tails[x["index"]] is not None:
                    ar[x["index"]] = tails[x["index"]].allreduce_s
                elif x["replicas"] > 1:
                    g = self.replica_boards(c, x["device"])
                    bw, lat = self.ring(g)
                    # between FPGAs the ring carries the exact gradient sums, framed (collective.ring_hop_s)
                    ar[x["index"]] = ring_allreduce_fpga_s(x["weight_bytes"], self.bpe_of_fmt(self.req.fmt),
                                                           x["replicas"], bw, lat,
                                                           None if c.schedule in ASYNC else link_clock(g[0].board, g[1].board))
        for x in stages:
            x["allreduce_s"] = ar[x["index"]]
            t = tails[x["index"]]
            x["flush_s"], x["update_s"] = (t.flush_s, t.update_s) if t is not None else (0.0, 0.0)
        # the replay shares physical links between transfers: per cut, the forward and
        # backward pieces (directed link ids, busy seconds, route latency)
        routes = []
        for x in stages[:-1]:
            d1, d2 = x["device"], (x["index"] + 1) % c.p
            if self.meshy(c):
                # one timed transfer per direction holding every link its hops use
                routes.append(tuple((self.mesh_piece(*self.mesh_transfer(c, d1, d2, x["last"], bw_)[:2]),)
                                    for bw_ in (False, True)))
                continue
            routes.append(tuple(self.framed_pieces(c, a_, b_, x["send_bytes"], x["beta"]) for a_, b_ in ((d1, d2), (d2, d1))))
        rings = None
        if self.train and any(x["replicas"] > 1 for x in stages):
            # ring all-reduce per stage over its replicas, hop i: replica i -> i+1, 1/r of the bytes
            rings = []
            for x in stages:
                g, r = self.replica_boards(c, x["device"]), x["replicas"]
                if r == 1:
                    rings.append(None)
                    continue
                hops = []
                t = tails[x["index"]]
                for i in range(r):
                    ids, bw, lat = self.hop(g[i].name, g[(i + 1) % r].name)
                    if t is not None:   # the HLS kernel's ring: every hop at the slowest one's pace
                        hops.append((ids, t.ring_occ_s if ids else 0.0, t.ring_lat_s))
                        continue
                    # other boards and the asynchronous schedules' per-micro-batch rings (not
                    # built in HLS) still move the weight bytes
                    clk = None if c.schedule in ASYNC else link_clock(g[i].board, g[(i + 1) % r].board)
                    occ, lat = ring_hop_s(x["weight_bytes"], self.bpe_of_fmt(self.req.fmt), r, bw, lat, clk)
                    hops.append((ids, occ if ids else 0.0, lat))
                rings.append((tuple(hops), ring_steps(r)))
        fw, bw_ = [x["fwd_s"] for x in stages], [x["bwd_s"] for x in stages]
        occ, lat_ = [x["send_occ"] for x in stages[:-1]], [x["send_lat"] for x in stages[:-1]]

        tl = [(x["flush_s"], x["update_s"]) for x in stages] if any(t is not None for t in tails) else None

        def once(m: int) -> float:
            return replay(c.schedule, c.p, m, fw, bw_, occ, lat_, c.v, ar, forward_only=not self.train,
                          routes=routes, rings=rings, tails=tl).iteration_s

        def steady(m: int) -> float:
            return replay_2bw(c.p, m, fw, bw_, routes, rings)[0]

        if self.train and c.schedule == "pipedream":
            # asynchronous PipeDream: one 1F1B stream, an update (and, replicated, an overlapped
            # all-reduce) after every micro-batch, no flush: ranked by its steady state;
            # the first iteration from an empty pipeline is what bapipe sim replays once
            cand.first_iteration_s = self.replayed(
                lambda m: replay_pipedream(c.p, m, fw, bw_, routes, rings, 1)[0], c)
            cand.iteration_s = self.replayed(lambda m: steady_pipedream(c.p, m, fw, bw_, routes, rings), c)
        else:
            cand.first_iteration_s = self.replayed(once, c)
            cand.iteration_s = cand.first_iteration_s
        if self.train and c.schedule == "2bw" and c.p > 1:
            # PipeDream-2BW never flushes: iterations follow each other in one 1F1B stream
            # and iteration j's all-reduce only has to end before iteration j+2 starts (the
            # second weight version covers j+1): priced in steady state over 4 iterations
            cand.iteration_s = self.replayed(steady, c)
        # busy time is linear in m: the busiest device's ops over the iteration
        busy = max(sum((x["fwd_s"] + x["bwd_s"]) for x in stages if x["device"] == d) for d in range(c.p)) * c.m
        # a steady state is a mean of differences of event times: with no bubble it can come out
        # an ulp below the busy time (tiny-mlp, one stage, pipedream: -2.2e-16), which plan.yaml
        # must not carry (bubble_fraction >= 0 is checked by every reader)
        cand.bubble = max(0.0, 1.0 - busy / cand.iteration_s) if cand.iteration_s > 0 else 0.0
        cand.stages = stages
        cand.boards_used = self.boards_used(c)
        if not all(self.blocks_fit(c, x) for x in stages):
            # a board whose kernels take more BRAM or URAM than it has cannot be built: never chosen
            cand.iteration_s = cand.first_iteration_s = math.inf
        return cand

    def blocks_fit(self, c: Config, x: dict) -> bool:
        """Whether stage ``x``'s kernels (forward, and backward in training) fit the stage's share
        of its board's BRAM and URAM (fpga_models.bwd_memory.stage_blocks_fit), in blocks as
        `bapipe check` counts them (fpga_models.allocate.fwd_kernel_blocks,
        fpga_models.bwd_memory.bwd_kernel_resources); True off FPGAs. Cached."""
        table = self.table(x["board_type"], c.v)
        if table.board.kind != "fpga" or x["style"] not in ("time-multiplexed", "dataflow") or x["mesh"] > 1:
            return True
        port = x.get("port_lanes")
        key = ("fits", x["first"], x["last"], x["board_type"], x["style"], c.v, port, x["beta"], c.m)
        if key not in self._links:
            self._links[key] = stage_blocks_fit(self.model, list(self.model.layers[x["first"]:x["last"] + 1]),
                                                table.board, {k: tuple(v) for k, v in x["folding"].items()},
                                                self.req.fmt, self.req.cap, c.v, self.train, x["style"], x["beta"],
                                                c.m * x["beta"], port,
                                                self.bwd_room(x["first"], x["last"], x["board_type"], c.v, port)
                                                if self.train and x["style"] == "time-multiplexed" else None)
        return self._links[key]
