"""What a plan's iteration is made of: per pipeline position, its time split into compute,
fills, off-chip traffic, link, all-reduce, update and bubble (docs/planner.md, "What limits
a plan").

Nothing here prices anything anew. The busy parts (compute, fills, off-chip) take the stage
times the search priced (``Candidate.stages``: ``fwd_s``/``bwd_s``, ``compute_f``/``compute_b``)
apart with the same cost functions it priced them with (planner.stagecost, fpga_models.allocate,
fpga_models.bwd_memory); the idle parts (link, all-reduce, bubble) come from the planner's own
event replay (planner.pipeline) of the same stage times, links and rings, watched by a probe.
Each position's parts add up to the plan's iteration time exactly (the bubble is the rest).
"""
from __future__ import annotations

import math

import numpy as np

from bapipe.layers import TRAIN_ONLY
from bapipe.schedules import ASYNC
from bapipe.fpga_models.allocate import (allocate_stage, frame_io_cycles, kernel_onchip_budget, tm_frame_copies,
                                         tm_offchip, tm_spill_cycles, tm_weight_cycles, tm_weight_tiles,
                                         weights_all_resident, weights_offchip)
from bapipe.fpga_models.boards import bytes_per_element
from bapipe.fpga_models.bwd_memory import bwd_memory, tm_bwd_engine_cycles, tm_bwd_spill_cycles
from bapipe.fpga_models.collective import ring_allreduce_fpga_s, ring_hop_s, ring_steps
from bapipe.fpga_models.cost import layer_cost, matrix_shape
from bapipe.fpga_models.engines import link_clock, weight_words, work_cycles
from bapipe.fpga_models.gradients import backward_work, no_input_gradient

from .pipeline import pipedream_window, replay, replay_2bw, replay_pipedream
from .search import Candidate, Explorer

#: the parts of a position's iteration, in the order they add up to the iteration time
PARTS = ("compute_s", "fills_s", "offchip_s", "link_s", "allreduce_s", "update_s", "bubble_s")
#: parts the planner does not price for some plans (reported as 0; docs/planner.md says so): the
#: update of the asynchronous schedules (per micro-batch, not built in HLS), of GPU stages and of
#: measured profiles (:func:`unpriced`)
UNPRICED = ("update_s",)


def unpriced(ex: Explorer, cand: Candidate) -> list[str]:
    """The parts of the candidate's breakdown left at 0 because nothing prices them: the update
    when some stage's tail (fpga_models.update) is not priced (Explorer.tails_priced)."""
    c = cand.config
    if ex.train and all(ex.tails_priced(c, x["board_type"]) and x["mesh"] == 1 for x in cand.stages):
        return []
    return [k[:-2] for k in UNPRICED]
#: micro-batches the split replays exactly (rounded up to a multiple of the positions);
#: beyond twice that its link and all-reduce parts are extrapolated linearly, as the planner
#: extrapolates its iteration time past 2 x REPLAY_M (a 64-position plan: two replays of 64
#: and 128 micro-batches, 0.3 s, instead of 128 and 256)
SPLIT_M = 32


def busy_parts(ex: Explorer, cand: Candidate, x: dict) -> dict:
    """Stage ``x`` (a ``cand.stages`` dict) per micro-batch: its ``fills`` and ``offchip``
    seconds (forward + backward) inside ``fwd_s + bwd_s``, and ``ddr_s``: the seconds its
    off-chip memory is busy (the stage model's spilled bytes at the board's off-chip
    bandwidth, plus the engines' 512-bit words at one a cycle). GPUs, measured profiles and
    tensor-parallel meshes: all compute (their price has no finer parts)."""
    c = cand.config
    table = ex.table(x["board_type"], c.v)
    board = table.board
    if board.kind != "fpga" or table.measured_f is not None or x["mesh"] > 1:
        return {"fills": 0.0, "offchip": 0.0, "ddr_s": 0.0}
    a, b, beta, clk = x["first"], x["last"], x["beta"], board.clock_hz
    sm = ex.stage_model(x["board_type"], beta, c.recompute, c.schedule, 1, c.v)
    r = {k: float(np.asarray(v)) for k, v in sm.cost(np.array(a), np.array(b), x["stashes"], c.v).items()}
    over_f = x["fwd_s"] - x["compute_f"]            # a pass bound by spilled traffic: max(compute, traffic)
    over_b = x["bwd_s"] - x["compute_b"] if ex.train else 0.0
    ddr = r["traffic_f"] + (r["traffic_b"] if ex.train else 0.0)
    lyr = list(ex.model.layers[a:b + 1])
    if x["style"] == "dataflow":
        fill_f, fill_b = _dataflow_fills(ex, lyr, board, x["folding"])
        if c.recompute and ex.train:
            fill_b += fill_f
        return {"fills": fill_f + fill_b, "offchip": over_f + over_b, "ddr_s": ddr}
    fill_f, fill_b = _tm_fills(ex, table, sm, a, b, beta)
    fold = {ex.model.layers[k].name: table.fold[k] for k in range(a, b + 1)}
    fmt, cap, train = ex.req.fmt, ex.req.cap, ex.train
    btype = x["board_type"]
    port = x.get("port_lanes")
    spill = _priced(ex, ("spill", a, b, btype, c.v, port), lambda: (
        tm_spill_cycles(lyr, board, fold, fmt, cap, c.v, train, port_lanes=port)
        + tm_weight_cycles(lyr, board, fold, fmt, cap, c.v, train, port))) * beta / clk
    extra_b = 0.0
    if train:
        # the two parts of bwd_memory.tm_bwd_extra_cycles: the off-chip frames' waits, and the tiled
        # engines' cycles beyond the per-layer figure, off-chip passes when more; fewer (a negative
        # part) is compute, not off-chip time
        budget, room = kernel_onchip_budget(board, cap, c.v, True), ex.bwd_room(a, b, btype, c.v, port)
        mem = bwd_memory(ex.model, lyr, board, fold, fmt, budget, c.m * beta, True, room)
        spill_b = tm_bwd_spill_cycles(ex.model, lyr, board, fold, fmt, budget, c.m * beta, mem)
        engine_b = tm_bwd_engine_cycles(ex.model, lyr, board, fold, fmt, c.m * beta, room)
        extra_b = (spill_b + max(0, engine_b)) * beta / clk
        if c.recompute:   # the backward re-runs the forward, its fills and off-chip waits too
            fill_b, extra_b = fill_b + fill_f, extra_b + spill
    ddr += (_tm_words(lyr, board, fold, fmt, cap, c.v, train, port) * beta / clk) + extra_b
    return {"fills": fill_f + fill_b, "offchip": spill + over_f + extra_b + over_b, "ddr_s": ddr}


def _priced(ex: Explorer, key: tuple, price) -> float:
    """The cycles Explorer.finish priced under ``key`` (its cache of a stage's off-chip
    cycles, so a vgg16- or GPT-3-sized stage's backward memory is not walked twice), else
    ``price()``: the same function with the same arguments."""
    got = ex._links.get(key)
    return got if isinstance(got, (int, float)) else price()


def _tm_fills(ex: Explorer, table, sm, a: int, b: int, beta: int) -> tuple[float, float]:
    """Forward and backward seconds of a time-multiplexed stage's turn fills (each layer's
    engine fill per sample, planner.stagecost.layer_times) and the sequencer's switch."""
    clk = table.board.clock_hz
    live = np.ones(len(ex.model.layers), dtype=bool)
    if not ex.train:   # inference prices dropout-like layers at 0 (planner.stagecost.stage_model)
        live = np.array([l.type not in TRAIN_ONLY for l in ex.model.layers])
    sl = slice(a, b + 1)
    fill = table.fill[sl] * beta
    f = float(np.sum(np.where((table.fwd_work[sl] > 0) & live[sl], fill, 0.0) / clk))
    bw = float(np.sum(np.where((table.bwd_work[sl] > 0) & live[sl], fill, 0.0) / clk)) if ex.train else 0.0
    has_b = ex.train and float(np.sum(work_cycles(table.bwd_work[sl], table.lanes[sl], beta))) > 0
    return f + sm.switch_s, bw + (sm.switch_s if has_b else 0.0)


def _dataflow_fills(ex: Explorer, layers, board, folding: dict) -> tuple[float, float]:
    """A dataflow stage's pipeline fill per micro-batch, forward and backward: its time is
    sum of the layers' cycles + (beta - 1) x the slowest (fpga_models.allocate.dataflow), of
    which all but one slowest interval is the first sample filling the chain."""
    no_dx = no_input_gradient(ex.model)
    f, b = [], []
    for l in layers:
        pe, simd = folding[l.name]
        lc = layer_cost(l, board, pe, simd, ex.req.fmt, 1)
        f.append(lc.fwd_cycles)
        b.append(backward_work(lc.bwd_in_cycles, lc.bwd_w_cycles, l.name not in no_dx) if ex.train else 0)
    clk = board.clock_hz
    return (sum(f) - max(f, default=0)) / clk, (sum(b) - max(b, default=0)) / clk


def _tm_words(layers, board, fold: dict, fmt: str, cap: float, v: int, train: bool, port: int | None = None) -> int:
    """512-bit words per sample a time-multiplexed forward kernel moves off chip: each
    off-chip frame written once and read by each of its readers (fpga_models.allocate
    .tm_spill_cycles' frames), and its weight fetches (the fill and every turn's,
    fpga_models.allocate.tm_weight_turns: each resident tile once, a streamed matrix once per
    input vector; its words, not the turn's cycles) when its weights live off chip."""
    bits = 8 * bytes_per_element(fmt)
    turns = [l for l in layers if l.type != "flatten"]
    words = 0
    for k, (cs, off) in enumerate(zip(tm_frame_copies(layers, fold), tm_offchip(layers, board, fold, fmt, cap, v,
                                                                               train, port))):
        if off:
            for _reader, lanes in cs:
                words += 2 * frame_io_cycles(int(turns[k].out_elems) // lanes, lanes, bits)
    if weights_offchip(layers, train):
        budget = kernel_onchip_budget(board, cap, v, train)
        tiles = tm_weight_tiles(layers, fold, fmt, budget)
        if not weights_all_resident([e for _l, e, _r in tiles], bits // 8, budget):   # else fetched once a call
            for l, e, resident in tiles:   # a resident tile is fetched once a sample, a streamed one per vector
                words += weight_words(e, bits) * (1 if resident else int(l.out_elems) // int(matrix_shape(l)[0]))
    return words


def replay_inputs(ex: Explorer, cand: Candidate) -> dict:
    """The arguments Explorer.finish replays the candidate with (stage times, per-stage
    all-reduce seconds, link routes, rings), rebuilt from its stages with the same methods;
    tests/test_breakdown.py checks that replaying them gives the plan's iteration time."""
    c, stages = cand.config, cand.stages
    fmt_b = ex.bpe_of_fmt(ex.req.fmt)
    async_ = c.schedule in ASYNC
    ar = [0.0] * len(stages)
    tails = ex.stage_tails(c, stages)   # the same tails Explorer.finish replayed
    if ex.train:
        for x in stages:
            if tails[x["index"]] is not None:
                ar[x["index"]] = tails[x["index"]].allreduce_s
            elif x["replicas"] > 1:
                g = ex.replica_boards(c, x["device"])
                bw, lat = ex.ring(g)
                ar[x["index"]] = ring_allreduce_fpga_s(x["weight_bytes"], fmt_b, x["replicas"], bw, lat,
                                                       None if async_ else link_clock(g[0].board, g[1].board))
    routes = []
    for x in stages[:-1]:
        d1, d2 = x["device"], (x["index"] + 1) % c.p
        if ex.meshy(c):
            routes.append(tuple((ex.mesh_piece(*ex.mesh_transfer(c, d1, d2, x["last"], back)[:2]),)
                                for back in (False, True)))
        else:
            routes.append(tuple(ex.framed_pieces(c, u, w, x["send_bytes"], x["beta"]) for u, w in ((d1, d2), (d2, d1))))
    rings = None
    if ex.train and any(x["replicas"] > 1 for x in stages):
        rings = []
        for x in stages:
            g, r = ex.replica_boards(c, x["device"]), x["replicas"]
            if r == 1:
                rings.append(None)
                continue
            hops = []
            t = tails[x["index"]]
            for i in range(r):
                ids, bw, lat = ex.hop(g[i].name, g[(i + 1) % r].name)
                if t is not None:
                    hops.append((ids, t.ring_occ_s if ids else 0.0, t.ring_lat_s))
                    continue
                clk = None if async_ else link_clock(g[i].board, g[(i + 1) % r].board)
                occ, lat = ring_hop_s(x["weight_bytes"], fmt_b, r, bw, lat, clk)
                hops.append((ids, occ if ids else 0.0, lat))
            rings.append((tuple(hops), ring_steps(r)))
    tl = None
    if any(x.get("update_s") or x.get("flush_s") for x in stages):
        tl = [(x.get("flush_s", 0.0), x.get("update_s", 0.0)) for x in stages]
    return {"fw": [x["fwd_s"] for x in stages], "bw": [x["bwd_s"] for x in stages],
            "occ": [x["send_occ"] for x in stages[:-1]], "lat": [x["send_lat"] for x in stages[:-1]],
            "ar": ar, "routes": routes, "rings": rings, "tails": tl}


class _Probe:
    """Per device, the idle time before each op split at the window [w0, w1): waiting for the
    producer (bubble), for the input on the wire (link), then for a gate (a ring all-reduce)."""

    def __init__(self, p: int):
        self.ops: list[list[tuple]] = [[] for _ in range(p)]

    def __call__(self, d, _is_f, _mb, _s, free, sent, arrived, start, dur) -> None:
        self.ops[d].append((free, sent, arrived, start, dur))

    def split(self, d: int, w0: float, w1: float) -> tuple[float, float]:
        """(link seconds, gate seconds) device d idles inside [w0, w1)."""
        clip = lambda t0, t1: max(0.0, min(t1, w1) - max(t0, w0))  # noqa: E731
        link = gate = 0.0
        for free, sent, arrived, start, _dur in self.ops[d]:
            if start <= free:
                continue
            t_b = max(free, min(sent, arrived))   # the input left its producer
            t_l = max(free, arrived)              # ... and arrived
            link += clip(t_b, t_l)
            gate += clip(t_l, start)
        return link, gate

    def last_end(self, d: int) -> float:
        """When device d's last op ended."""
        free, _s, _a, start, dur = self.ops[d][-1]
        return start + dur


def idle_parts(ex: Explorer, cand: Candidate) -> np.ndarray:
    """Per device (link, all-reduce) seconds per iteration from the planner's replay (exact up
    to 2 x SPLIT_M micro-batches, then extrapolated linearly like the planner's iteration time)."""
    c = cand.config
    inp = replay_inputs(ex, cand)
    fw, bw, routes, rings = inp["fw"], inp["bw"], inp["routes"], inp["rings"]
    p = c.p

    def measure(m: int) -> np.ndarray:
        pr = _Probe(p)
        if ex.train and c.schedule == "pipedream":
            j0, n = pipedream_window(p, m)
            ends = replay_pipedream(p, m, fw, bw, routes, rings, 2 * j0 + n + 1, probe=pr)
            return np.array([pr.split(d, ends[j0], ends[j0 + n]) for d in range(p)]) / n
        if ex.train and c.schedule == "2bw" and p > 1:
            steady, first = replay_2bw(p, m, fw, bw, routes, rings, probe=pr)
            return np.array([pr.split(d, first, first + 2 * steady) for d in range(p)]) / 2
        rp = replay(c.schedule, p, m, fw, bw, inp["occ"], inp["lat"], c.v, inp["ar"], forward_only=not ex.train,
                    routes=routes, rings=rings, probe=pr, tails=inp["tails"])
        out = []
        for d in range(p):
            link, gate = pr.split(d, 0.0, rp.iteration_s)
            out.append((link, gate + max(0.0, rp.finish_s[d] - pr.last_end(d))))   # the ring after the last op
        return np.array(out)

    m1 = p * -(-SPLIT_M // p)   # a multiple of p (interleaving), past 1F1B's warm-up
    if c.m <= 2 * m1:
        return measure(c.m)
    t1, t2 = measure(m1), measure(2 * m1)   # Explorer.replayed's rule at m1: linear in m past the warm-up
    return t2 + (c.m - 2 * m1) * (t2 - t1) / m1


def _close(parts: list[float], total: float) -> float:
    """The last part such that adding ``parts`` and it left to right gives ``total`` exactly
    (the rest of the iteration, nudged by the last ulps of the additions)."""
    s = 0.0
    for x in parts:
        s += x
    last = total - s
    for _ in range(8):
        if s + last == total:
            break
        last = math.nextafter(last, math.inf if s + last < total else -math.inf)
    return last


def breakdown(ex: Explorer, cand: Candidate) -> list[dict]:
    """Per pipeline position (one stage each unless interleaved): its stages, boards and the
    seconds of one iteration spent in each of PARTS; they add up (left to right, in PARTS
    order) to the plan's iteration time ``cand.iteration_s`` exactly."""
    c, T = cand.config, cand.iteration_s
    idle = idle_parts(ex, cand)
    out = []
    for d in range(c.p):
        xs = [x for x in cand.stages if x["device"] == d]
        busy = c.m * sum(x["fwd_s"] + x["bwd_s"] for x in xs)
        parts = [busy_parts(ex, cand, x) for x in xs]
        fills = c.m * sum(q["fills"] for q in parts)
        offchip = c.m * sum(q["offchip"] for q in parts)
        compute = max(0.0, busy - fills - offchip)
        link, ar = (float(v) for v in idle[d])
        room = T - busy
        if link + ar > max(0.0, room):   # a steady window's ops straddle its ends: keep within the iteration
            k = max(0.0, room) / (link + ar)   # link + ar > 0 here
            link, ar = link * k, ar * k
        # the tail after the device's last op is its stages' flush, ring and update: the flush
        # and the update (fpga_models.update) are the update part, the rest the all-reduce
        upd = min(ar, sum(x.get("flush_s", 0.0) + x.get("update_s", 0.0) for x in xs))
        vals = [compute, fills, offchip, link, ar - upd, upd]
        bubble = _close(vals, T)
        if bubble < 0:   # rounding only (|bubble| ~ ulps of T): taken off compute instead
            vals[0] = max(0.0, vals[0] + bubble)
            bubble = max(0.0, _close(vals, T))
        out.append({"position": d, "stages": [x["index"] for x in xs], "boards": xs[0]["boards"],
                    "board_kind": ex.table(xs[0]["board_type"], c.v).board.kind,
                    **dict(zip(PARTS, vals + [bubble])),
                    "ddr_busy_s": c.m * sum(q["ddr_s"] for q in parts)})
    return out
