"""Placement within a board: a lowering pass from the generated project (``codegen.design.context``'s
ProjectCtx: kernels, their m_axi arguments and streams) and the cluster to

- each compute unit's SLR, by its DSP / BRAM36 / URAM need (deterministic worst-fit
  decreasing bin packing over the board's per-SLR usable resources, fpga_models.boards);
- each m_axi bundle the kernels declare a memory bank (DDR boards: the least-loaded bank by
  bytes, then the one nearest the unit's SLR; HBM boards: pseudo-channels round-robin, a range
  when an array outgrows one);
- the network glue between boards (XUP VNx UDP stack or Aurora 64B/66B; codegen.design.netnames
  holds every name), with the socket / channel table the host programs.

``place_project`` returns plain data: written into build/design.json (``placement``) and read by
link.cfg.j2 (through ``link_lines``). Nothing here touches the disk. Needs come from
``fpga_models.engines`` (DSP of the MVUs at the plan's folding) and ``codegen.design.onchip`` (the
Design's on-chip bytes per kernel).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from bapipe.errors import SpecError
from bapipe.fpga_models.boards import BRAM36_BYTES, URAM_BYTES, Board
from bapipe.fpga_models.allocate import engines_dsp, kernel_dsp
from bapipe.fpga_models.engines import engine_kind, mvu_dsp

from bapipe.codegen.design import netnames as nn
from bapipe.codegen.design.onchip import elem_bytes, kernel_onchip_bytes

#: kernels that move data between host memory and the stage streams (codegen.design.context)
MOVERS = ("mm2s", "s2mm")
#: UG1393 / UG1700 "Mapping Kernel Ports to Memory": up to 15 kernel interfaces on one global
#: memory bank (what `bapipe check`'s masters rule holds the link configs to)
MAX_MASTERS_PER_BANK = 15


def bundle_name(arg: str) -> str:
    """The m_axi bundle of kernel argument ``arg``: one bundle per argument, so that each can
    sit in its own memory bank (v++ maps a bundle, not an argument, to a bank)."""
    return f"gmem_{arg}"


@dataclass(frozen=True)
class Need:
    """What one compute unit takes from an SLR."""

    dsp: int
    bram36: int
    uram: int
    onchip_bytes: int

    def to_dict(self) -> dict:
        return {"dsp": self.dsp, "bram36": self.bram36, "uram": self.uram, "onchip_bytes": self.onchip_bytes}


def memory_blocks(nbytes: int, uram_free: int) -> tuple[int, int]:
    """(BRAM36, URAM) holding ``nbytes``: whole URAMs (8x denser) for the bulk as far as
    ``uram_free`` goes, the remainder (less than one URAM, or what URAM cannot take) in BRAM36."""
    uram = min(uram_free, nbytes // URAM_BYTES) if nbytes > 0 else 0
    rest = max(0, nbytes - uram * URAM_BYTES)
    return math.ceil(rest / BRAM36_BYTES), uram


def layer_dsp(stage_ctx, plan_stage, board: Board, fmt: str) -> list[int]:
    """DSP of each matrix layer's PE x SIMD array at the plan's folding (fpga_models.engines.mvu_dsp)."""
    dpm = board.dsp_per_mac.get(fmt, 1.0)
    per = []
    for lc in stage_ctx.layers:
        if lc.layer is None or engine_kind(lc.layer.type) != "mvu":
            continue
        fo = plan_stage.folding.get(lc.name)
        per.append(mvu_dsp(fo.pe if fo else 1, fo.simd if fo else 1, dpm))
    return per


def stage_dsp(stage_ctx, plan_stage, board: Board, fmt: str) -> int:
    """DSP slices of a stage's forward kernel: its MVUs' arrays summed when every layer has its
    engine (dataflow), the largest when they take turns on one (fpga_models.allocate.engines_dsp)."""
    return engines_dsp(layer_dsp(stage_ctx, plan_stage, board, fmt), "dataflow" if stage_ctx.dataflow else "tm")


def kernel_needs(ctx, board: Board, fmt: str) -> dict[str, Need]:
    """Each stage kernel's need: DSP from the board-budget rule (fpga_models.allocate.kernel_dsp:
    the forward kernel one PE x SIMD array per MVU layer, the backward kernel at the same
    folding a weight-gradient array and, for the layers whose dx it computes (``dx_layers``,
    fpga_models.gradients), an input-gradient array, codegen.design.backward); BRAM36/URAM from the
    Design's on-chip bytes."""
    plan_stage = {st.index: st for st in ctx.plan.stages}
    out: dict[str, Need] = {}
    for s in ctx.stages:
        per = layer_dsp(s, plan_stage[s.index], board, fmt)
        style = "dataflow" if s.dataflow else "tm"
        # the backward kernel's input-gradient arrays: only for the layers whose dx it computes
        mvus = [lc.name for lc in s.layers if lc.layer is not None and engine_kind(lc.layer.type) == "mvu"]
        dx = [n in s.bwd.dx_layers for n in mvus] if hasattr(s.bwd, "dx_layers") else None
        for name, role in [(s.name, "fwd")] + ([(s.bwd.name, "bwd")] if s.bwd is not None else []):
            # the board-budget rule's figure (the planner's); the backward's tiled engines' own DSP
            # (fpga_models.bwd_tiles.kernel_dsp) is design.json's backward_memory.resources
            bram, uram = _blocks_of(s, ctx.fmt, role)
            out[name] = Need(kernel_dsp(per, style, role, dx), bram, uram,
                             kernel_onchip_bytes(s, ctx.fmt, bwd=role == "bwd"))
    return out


def _blocks_of(s, fmt, role: str) -> tuple[int, int]:
    """(BRAM36, URAM) of a stage's kernel of ``role`` as the Design declares it (UG573 blocks:
    codegen.design.onchip.kernel_blocks, codegen.design.bwd_engines.design_blocks, what `bapipe
    check` counts), (0, 0) when the Design states none (the bytes then stand for it)."""
    if role == "bwd":
        if s.bwd is None or not hasattr(s.bwd, "arrays"):
            return 0, 0
        from bapipe.codegen.design.bwd_engines import design_blocks

        b = design_blocks(s.bwd)
        return math.ceil(b["bram36"]), int(b["uram"])
    from bapipe.codegen.design.onchip import kernel_blocks

    b = kernel_blocks(s, fmt)
    return (math.ceil(b.bram36), b.uram) if b is not None else (0, 0)


def _fits(f: dict, need: Need) -> tuple[int, int] | None:
    """The (BRAM36, URAM) ``need`` takes of an SLR's free ``f``, or None when it does not fit: its
    blocks when the Design states them (a URAM bank cannot become BRAM: UG573), else its bytes as
    whole URAMs for the bulk and BRAM36 for the rest."""
    if need.bram36 or need.uram:
        bram, uram = need.bram36, need.uram
        return (bram, uram) if need.dsp <= f["dsp"] and bram <= f["bram36"] and uram <= f["uram"] else None
    bram, uram = memory_blocks(need.onchip_bytes, f["uram"])
    return (bram, uram) if need.dsp <= f["dsp"] and bram <= f["bram36"] else None


# --- SLRs ----------------------------------------------------------------------------------


def place_units(board: Board, units: list[tuple[str, Need]], fixed: dict[str, int],
                near: dict[str, int] | None = None) -> dict:
    """Worst-fit decreasing: the biggest unit first (DSP, then bytes, then name) into the SLR with
    the most DSP left where it fits (spreads load; ties to the lower SLR) in DSP, BRAM36 and URAM
    as the Design declares its blocks (:func:`_fits`; a unit without them: on-chip bytes as
    whole URAMs for the bulk, BRAM36 for the rest). A unit that fits no single SLR spans the
    fewest adjacent SLRs that hold it (``slr`` None: v++ places it unpinned, across SLL
    crossings); one that does not fit what the board has left is ``unplaced`` (the board is
    oversubscribed; :func:`oversubscribed` says by how much).
    ``fixed``: instance -> SLR for units pinned by rule (network kernels next to the QSFP28s);
    ``near``: instance -> SLR it should be close to (its memory: HBM sits behind SLR0), the
    first criterion among the SLRs it fits."""
    near = near or {}
    free = [{"dsp": s.usable_dsp, "bram36": s.usable_bram36, "uram": s.usable_uram} for s in board.slrs]
    out: dict[str, dict] = {}
    for inst, slr in sorted(fixed.items()):
        out[inst] = {"slr": slr, "spans": [slr], "need": Need(0, 0, 0, 0).to_dict(), "pinned_by": "qsfp28"}
    order = sorted(units, key=lambda u: (-u[1].dsp, -u[1].onchip_bytes, u[0]))
    for inst, need in order:
        best = None
        for k, f in enumerate(free):
            took = _fits(f, need)
            if took is not None:
                bram, uram = took
                key = (abs(k - near[inst]) if inst in near else 0, -f["dsp"], -(f["bram36"] - bram), k)
                if best is None or key < best[0]:
                    best = (key, k, bram, uram)
        if best is not None:
            _, k, bram, uram = best
            free[k]["dsp"] -= need.dsp
            free[k]["bram36"] -= bram
            free[k]["uram"] -= uram
            out[inst] = {"slr": k, "spans": [k], "need": Need(need.dsp, bram, uram, need.onchip_bytes).to_dict()}
            continue
        span = _span(free, need)
        if span is None:
            out[inst] = {"slr": None, "spans": [], "need": need.to_dict(), "unplaced": True}
            continue
        out[inst] = {"slr": None, "spans": span, "need": _take(free, span, need)}
    return out


def oversubscribed(board: Board, placed: dict) -> dict | None:
    """What the board's units need in all against what it has (None when everything is placed)."""
    if not any(p.get("unplaced") for p in placed.values()):
        return None
    need = {"dsp": sum(p["need"]["dsp"] for p in placed.values()),
            "onchip_bytes": sum(p["need"]["onchip_bytes"] for p in placed.values())}
    return {"units": sorted(i for i, p in placed.items() if p.get("unplaced")), "need_dsp": need["dsp"],
            "usable_dsp": board.usable_dsp, "need_onchip_bytes": need["onchip_bytes"],
            "usable_onchip_bytes": sum(s.on_chip_bytes for s in board.slrs)}


def check_stage_fits(ctx, boards: dict[str, Board], where: str) -> None:
    """A stage whose forward kernel alone needs more DSP than its board has usable, or a board
    whose kernels together need more on-chip bytes than it has usable (the Design's figures,
    codegen.design.onchip), cannot be built: SpecError (exit 2) naming the stage, the board and both
    figures."""
    plan_stage = {st.index: st for st in ctx.plan.stages}
    for s in ctx.stages:
        for bname in s.boards:
            board = boards.get(bname)
            if board is None or not board.slrs:
                continue
            dsp = stage_dsp(s, plan_stage[s.index], board, ctx.plan.number_format)
            # DSP and on-chip bytes are the planner's budget (fpga_models.allocate shares them
            # over the board's kernels; time-multiplexed frame buffers beyond a kernel's share go
            # off chip by the same rule, codegen.design.tm_kernel), so a board over them is refused
            if dsp > board.usable_dsp:
                what = f"{dsp:,} DSP, the board has {board.usable_dsp:,} usable"
                pos = next(i for i, st in enumerate(ctx.plan.stages) if st.index == s.index)
                raise SpecError(where, None, f"stages[{pos}].folding",
                                f"expected stage {s.index} to fit board {bname} ({board.name}): its kernel "
                                f"{s.name} needs {what}")
    on_board: dict[str, list] = {}
    for s in ctx.stages:
        for bname in s.boards:
            on_board.setdefault(bname, []).append(s)
    for bname, sts in on_board.items():
        board = boards.get(bname)
        if board is None or not board.slrs:
            continue
        kernels = [(s.name, kernel_onchip_bytes(s, ctx.fmt)) for s in sts] + \
            [(s.bwd.name, kernel_onchip_bytes(s, ctx.fmt, bwd=True)) for s in sts if s.bwd is not None]
        need, have = sum(b for _k, b in kernels), sum(x.on_chip_bytes for x in board.slrs)
        if need > have:
            pos = next(i for i, st in enumerate(ctx.plan.stages) if st.index == sts[0].index)
            each = ", ".join(f"{k} {b:,}" for k, b in kernels)
            raise SpecError(where, None, f"stages[{pos}].boards",
                            f"expected the kernels on board {bname} ({board.name}) to fit its on-chip memory: "
                            f"they need {need:,} bytes ({each}), the board has {have:,} usable")


def _span(free: list[dict], need: Need) -> list[int] | None:
    """The fewest adjacent SLRs (lowest first) whose free resources together hold ``need``."""
    n = len(free)
    for width in range(2, n + 1):
        for lo in range(0, n - width + 1):
            ks = list(range(lo, lo + width))
            dsp = sum(free[k]["dsp"] for k in ks)
            if need.bram36 or need.uram:   # the Design's blocks
                if need.dsp <= dsp and need.bram36 <= sum(free[k]["bram36"] for k in ks) \
                        and need.uram <= sum(free[k]["uram"] for k in ks):
                    return ks
                continue
            nbytes = sum(free[k]["bram36"] * BRAM36_BYTES + free[k]["uram"] * URAM_BYTES for k in ks)
            if need.dsp <= dsp and need.onchip_bytes <= nbytes:
                return ks
    return None


def _take(free: list[dict], span: list[int], need: Need) -> dict:
    """Subtract ``need`` from the spanned SLRs, filling them in order; the blocks taken."""
    dsp, nbytes, bram_t, uram_t, per = need.dsp, need.onchip_bytes, 0, 0, []
    blocks = bool(need.bram36 or need.uram)   # the Design's blocks, else its bytes
    bram_left, uram_left = need.bram36, need.uram
    for k in span:
        d = min(dsp, free[k]["dsp"])
        free[k]["dsp"] -= d
        dsp -= d
        if blocks:
            u, b = min(free[k]["uram"], uram_left), min(free[k]["bram36"], bram_left)
            uram_left, bram_left = uram_left - u, bram_left - b
        else:
            u = min(free[k]["uram"], nbytes // URAM_BYTES) if nbytes > 0 else 0
            nbytes = max(0, nbytes - u * URAM_BYTES)
            b = min(free[k]["bram36"], math.ceil(nbytes / BRAM36_BYTES)) if nbytes > 0 else 0
            nbytes = max(0, nbytes - b * BRAM36_BYTES)
        free[k]["uram"] -= u
        free[k]["bram36"] -= b
        uram_t, bram_t = uram_t + u, bram_t + b
        per.append({"slr": k, "dsp": d, "bram36": b, "uram": u})
    return Need(need.dsp, bram_t, uram_t, need.onchip_bytes).to_dict() | {"per_slr": per}


# --- memory banks --------------------------------------------------------------------------


def assign_banks(board: Board, ports: list[tuple[str, str, int]], slr_of: dict[str, int | None],
                 bundle_of: dict[tuple[str, str], str] | None = None,
                 same_as: dict[tuple[str, str], tuple[str, str]] | None = None) -> list[dict]:
    """A bank for each m_axi bundle of each unit; ``ports`` lists (instance, argument, bytes) in
    order, ``bundle_of`` maps (instance, argument) to the bundle the kernel declares (default
    :func:`bundle_name`: one per argument). Arguments sharing a bundle share its bank (v++ maps
    bundles, not arguments). HBM boards: the next free pseudo-channel(s) round-robin (a bundle
    larger than one takes a range ``HBM[a:b]``). DDR boards: by bandwidth: the bank with the
    fewest bytes assigned so far (the arrays are read once per sample, so bytes stand for
    bandwidth), then the fewest bundles, then the one nearest the unit's SLR, then the name.
    ``same_as``: (instance, bundle) -> the (instance, bundle) whose bank it takes (a buffer the
    host passes to two kernels must sit in one bank: training builds, codegen.package.xrt_train)."""
    bundle_of = bundle_of or {}
    same_as = same_as or {}
    groups: dict[tuple[str, str], int] = {}
    for inst, arg, nbytes in ports:
        key = (inst, bundle_of.get((inst, arg), bundle_name(arg)))
        groups[key] = groups.get(key, 0) + nbytes
    follows = {k: same_as[k] for k in groups if k in same_as and same_as[k] in groups and same_as[k] != k}
    groups = {k: v for k, v in groups.items() if k not in follows}
    # masters a group brings to its bank: itself and the bundles that must share it
    brings = {k: 1 + sum(1 for f in follows.values() if f == k) for k in groups}
    hbm = [b for b in board.banks if b.kind == "hbm"]
    ddr = [b for b in board.banks if b.kind != "hbm"]
    load, nxt, bank_of = {b.name: [0, 0] for b in board.banks}, 0, {}
    for (inst, bundle), nbytes in groups.items():
        if hbm:
            n = max(1, math.ceil(nbytes / hbm[0].bytes))
            if n > len(hbm):
                raise SpecError(None, None, f"boards.{board.name}",
                                f"expected {inst} bundle {bundle} ({nbytes:,} bytes) to fit the board's HBM")
            if nxt + n > len(hbm):
                nxt = 0
            names = [hbm[nxt + i].name for i in range(n)]
            bank = names[0] if n == 1 else f"HBM[{nxt}:{nxt + n - 1}]"
            nxt = (nxt + n) % len(hbm)
        else:
            slr = slr_of.get(inst)
            dist = (lambda b: 0) if slr is None else (lambda b: abs(b.slr - slr))
            # the vendor's limit first (UG1393: at most MAX_MASTERS_PER_BANK interfaces a bank),
            # then bandwidth
            k = brings[(inst, bundle)]
            pick = min(ddr, key=lambda b: (load[b.name][1] + k > MAX_MASTERS_PER_BANK, load[b.name][0],
                                           load[b.name][1], dist(b), b.name))
            names, bank = [pick.name], pick.name
        for nm in names:
            load[nm][0] += nbytes
            load[nm][1] += brings[(inst, bundle)]
        bank_of[(inst, bundle)] = bank
    for k, leader in follows.items():
        bank_of[k] = bank_of[leader]
    out = []
    for inst, arg, nbytes in ports:
        bundle = bundle_of.get((inst, arg), bundle_name(arg))
        out.append({"instance": inst, "arg": arg, "bundle": bundle, "bank": bank_of[(inst, bundle)],
                    "bytes": nbytes})
    return out


_PRAGMA = re.compile(r"#pragma\s+HLS\s+INTERFACE\s+([^\n]*)")


def declared_bundles(source: str) -> dict[str, str]:
    """argument -> m_axi bundle, as a kernel's ``#pragma HLS INTERFACE m_axi`` lines declare them
    (an m_axi argument without ``bundle=`` is on Vitis HLS's default bundle ``gmem``)."""
    out = {}
    for m in _PRAGMA.finditer(source):
        words = m.group(1).split()
        kv = dict(w.split("=", 1) for w in words if "=" in w)
        mode = kv.get("mode") or next((w for w in words if "=" not in w), "")
        if mode == "m_axi" and "port" in kv:
            out[kv["port"]] = kv.get("bundle", "gmem")
    return out


def kernel_bundles(ctx, sources: dict) -> dict[str, dict[str, str]]:
    """kernel name -> its arguments' bundles, from the rendered kernel sources (path -> bytes)."""
    names = {s.name: f"{s.name}/{s.name}.cpp" for s in ctx.stages}
    names.update({s.bwd.name: f"{s.name}/{s.bwd.name}.cpp" for s in ctx.stages if s.bwd is not None})
    from bapipe.codegen.design.context import _train_kernel_names   # training: update, all-reduce and loss kernels
    last = max((s.index for s in ctx.stages), default=0)
    names.update({k: f"{s.name}/{k}.cpp" for s in ctx.stages for k in _train_kernel_names(s, last)})
    names.update({m: f"common/{m}.cpp" for m in MOVERS})
    out = {}
    for k, path in names.items():
        text = sources.get(path)
        if text is not None:
            out[k] = declared_bundles(text.decode() if isinstance(text, bytes) else text)
    return out


# --- network glue --------------------------------------------------------------------------


def _fpga_neighbours(cluster, board: str) -> list[str]:
    """The board's directly linked FPGA boards, in the cluster's link order: QSFP28 port k faces
    the k-th of them."""
    names = {cb.name for cb in cluster.boards}
    out = []
    for ln in cluster.links:
        for a, b in ((ln.a, ln.b), (ln.b, ln.a)):
            if a == board and b in names and b not in out:
                out.append(b)
    return out


def _link_kind(cluster, a: str, b: str) -> str:
    for ln in cluster.links:
        if {ln.a, ln.b} == {a, b}:
            return ln.kind
    return "network"


def _peer(cluster, src_boards: list[str], dst_boards: list[str], board: str) -> str:
    """The board of the other stage that ``board`` (one replica of its stage) talks to: replicas
    are matched in order to the nearest unused peer (fewest hops, then name)."""
    if board in dst_boards:
        return board
    used: set[str] = set()
    for b in src_boards:
        cands = [d for d in dst_boards if d not in used] or list(dst_boards)
        best = min(cands, key=lambda d: (len(cluster.route(b, d)), d))
        used.add(best)
        if b == board:
            return best
    return dst_boards[0]


def channels(ctx, cluster) -> list[dict]:
    """Every stream crossing a board boundary: one channel from (board, kernel, port) to
    (board, kernel, port), in a fixed order (stages, forward then backward, ports)."""
    by_tensor_out: dict[str, list] = {}
    for s in ctx.stages:
        for p in s.outputs:
            by_tensor_out.setdefault(p.tensor, []).append(s)
    out = []

    def consumer(s, tensor):
        return next((x for x in ctx.stages if x.index > s.index and any(q.tensor == tensor for q in x.inputs)), None)

    def producer(s, tensor):
        return next((x for x in reversed(ctx.stages) if x.index < s.index
                     and any(q.tensor == tensor for q in x.outputs)), None)

    for s in ctx.stages:
        for p in s.outputs:
            d = consumer(s, p.tensor)
            if d is None or d.boards == s.boards:
                continue    # the context connects same-board forward streams directly
            q = next(q for q in d.inputs if q.tensor == p.tensor)
            for b in s.boards:
                out.append({"src": (b, s.name, p.name), "dst": (_peer(cluster, s.boards, d.boards, b), d.name, q.name),
                            "tensor": p.tensor, "elements": p.elements})
        if s.bwd is None:
            continue
        for p in s.bwd.out_ports:            # dx_<in>: to the producer's backward kernel (dy_<out>)
            u = producer(s, p.tensor)
            if u is None or u.bwd is None:
                continue
            q = next(q for q in u.outputs if q.tensor == p.tensor)
            for b in s.boards:
                out.append({"src": (b, s.bwd.name, p.name),
                            "dst": (_peer(cluster, s.boards, u.boards, b), u.bwd.name, f"dy_{q.name}"),
                            "tensor": p.tensor, "elements": p.elements, "local": u.boards == s.boards})
    for s in ctx.stages:   # training: the all-reduce ring between a stage's replicas (codegen.design.train_kernels)
        u = getattr(s, "update", None)
        if u is None or u.replicas < 2 or len(s.boards) != u.replicas:
            continue
        ak = u.allreduce_name
        for k, b in enumerate(s.boards):
            out.append({"src": (b, ak, "ring_out"), "dst": (s.boards[(k + 1) % u.replicas], ak, "ring_in"),
                        "tensor": f"{ak}_ring", "elements": u.ring_elements(ctx.fmt.width)})
    return out


def network(ctx, cluster, where: str = "plan.yaml") -> dict[str, dict]:
    """Per board: its QSFP28 ports in use, each with its stack (vnx | aurora), framing kernel shape
    and sockets (TDEST = socket index: transmit channels first, then receive channels)."""
    boards = {cb.name: cb.board for cb in cluster.boards}
    ports: dict[str, dict[int, dict]] = {}
    allc = channels(ctx, cluster)
    local = [c for c in allc if c.get("local")]
    chans = [c for c in allc if not c.get("local")]
    ends = []
    for c in chans:
        (sb, _, _), (db, _, _) = c["src"], c["dst"]
        route = cluster.route(sb, db)
        first = route[0].b if route[0].a == sb else route[0].a
        last = route[-1].a if route[-1].b == db else route[-1].b
        ends.append((sb, first, "tx"))
        ends.append((db, last, "rx"))
        c["hops"] = len(route)
        c["stack"] = nn.AURORA if _link_kind(cluster, sb, first) == nn.AURORA else nn.VNX
    for i, c in enumerate(chans):
        for (board, towards, direction), end in zip(ends[2 * i:2 * i + 2], ("src", "dst")):
            nb = _fpga_neighbours(cluster, board)
            qsfp = nb.index(towards)
            if qsfp >= boards[board].network_ports:
                raise SpecError(where, None, f"boards.{board}",
                                f"expected at most {boards[board].network_ports} QSFP28 ports in use: the link "
                                f"to {towards} would be port {qsfp}")
            port = ports.setdefault(board, {}).setdefault(qsfp, {"qsfp": qsfp, "towards": towards, "stack": c["stack"],
                                                                  "tx": [], "rx": []})
            port[direction].append(i)
            c[end + "_qsfp"] = qsfp
    out: dict[str, dict] = {}
    for board, by_q in ports.items():
        out[board] = {}
        for q, port in sorted(by_q.items()):
            t, r = len(port["tx"]), len(port["rx"])
            if t + r > nn.MAX_CHANNELS:
                raise SpecError(where, None, f"boards.{board}",
                                f"expected at most {nn.MAX_CHANNELS} channels on QSFP28 port {q} (the XUP VNx "
                                f"socket table), got {t + r}")
            for k, ci in enumerate(port["tx"]):
                chans[ci]["src_socket"] = k
            for k, ci in enumerate(port["rx"]):
                chans[ci]["dst_socket"] = t + k
            out[board][q] = {**port, "kernel": nn.net_board_kernel(board, q), "shape": nn.net_kernel(t, r),
                             "instance": nn.net_instance(q)}
    return {"ports": out, "channels": chans, "local": local}


# --- the whole pass ------------------------------------------------------------------------


def _m_axi_ports(b, by_name, fmt) -> list[tuple[str, str, int]]:
    """(instance, argument, bytes) of every ``sp`` line of the board, in their order."""
    eb = elem_bytes(fmt)
    sizes = {}
    for s in by_name.values():
        for w in s.weights:
            sizes[(f"{s.name}_1", w.name)] = int(w.kernel_q.size) * eb
        if s.engine is not None:   # engine kernels: banked weight arrays, off-chip frame buffers
            for r in s.engine.external:
                sizes[(f"{s.name}_1", r.name)] = r.size * eb
            for f in s.engine.frames:
                sizes[(f"{s.name}_1", f.name)] = f.bytes
        if s.bwd is not None:
            for a in s.bwd.grad_arrays:
                sizes[(f"{s.bwd.name}_1", a.name)] = int(a.count) * eb
            for w in s.bwd.weights:
                sizes[(f"{s.bwd.name}_1", w.name)] = int(w.kernel_q.size) * eb
            for f in s.bwd.frames:   # time-multiplexed backward: gradient frames off chip
                sizes[(f"{s.bwd.name}_1", f.name)] = f.bytes
    out = []
    for line in b.sp:
        ep, _, _bank = line.rpartition(":")
        inst, _, arg = ep.partition(".")
        out.append((inst, arg, sizes.get((inst, arg), 0)))
    return out


def place_project(ctx, cluster, where: str = "plan.yaml", sources: dict | None = None) -> dict:
    """The placement of every board (see the module docstring). ``sources``: the rendered files
    (path -> bytes), whose m_axi pragmas say which arguments share a bundle."""
    where = getattr(ctx, "plan_file", where)
    if cluster is None:   # no cluster: catalog boards by type, nothing between boards to wire
        from bapipe.fpga_models.boards import get_board
        from bapipe.codegen.design.context import _board_type_key
        boards = {b.name: get_board(_board_type_key(b.board_type)) for b in ctx.boards}
        net = {"ports": {}, "channels": [], "local": []}
    else:
        boards = {cb.name: cb.board for cb in cluster.boards}
        net = network(ctx, cluster, where)
    check_stage_fits(ctx, boards, where)
    by_name = {s.name: s for s in ctx.stages}
    out = {}
    for b in ctx.boards:
        board = boards[b.name]
        needs = kernel_needs(ctx, board, ctx.plan.number_format)
        units = []
        for line in b.nk:
            kernel, _, insts = line.split(":")
            for inst in insts.split("."):
                units.append((inst, needs.get(kernel, Need(0, 0, 0, 0)), kernel))
        fixed, kernel_of = {}, {i: k for i, _n, k in units}
        for q, port in net["ports"].get(b.name, {}).items():
            glue = [(port["instance"], port["kernel"])]
            glue += ([(nn.vnx_netlayer_instance(q), nn.VNX_NETLAYER), (nn.cmac_kernel(q), nn.cmac_kernel(q))]
                     if port["stack"] == nn.VNX else [(nn.aurora_kernel(q), nn.aurora_kernel(q))])
            for inst, kernel in glue:
                fixed[inst] = board.qsfp_slr
                kernel_of[inst] = kernel
        # HBM boards: units with m_axi ports close to the SLR behind which the HBM sits
        hbm_slrs = {k.slr for k in board.banks if k.kind == "hbm"}
        near = {i: min(hbm_slrs) for i, _a, _n in _m_axi_ports(b, by_name, ctx.fmt)} if len(hbm_slrs) == 1 else {}
        placed = place_units(board, [(i, n) for i, n, _k in units], fixed, near)
        slr_of = {i: p["slr"] for i, p in placed.items()}
        bundles = kernel_bundles(ctx, sources or {})
        bundle_of = {(i, a): bundles[kernel_of[i]][a] for i, a, _n in _m_axi_ports(b, by_name, ctx.fmt)
                     if a in bundles.get(kernel_of.get(i, ""), {})}
        same_as = {}
        for group in shared_buffers(ctx):   # training: one bank per buffer two kernels share
            lead = (group[0][0], bundle_of.get(group[0], bundle_name(group[0][1])))
            for ia in group[1:]:
                same_as[(ia[0], bundle_of.get(ia, bundle_name(ia[1])))] = lead
        ports = assign_banks(board, _m_axi_ports(b, by_name, ctx.fmt), slr_of, bundle_of, same_as)
        used = {"dsp": [0] * len(board.slrs), "bram36": [0] * len(board.slrs), "uram": [0] * len(board.slrs)}
        for p in placed.values():
            if p["slr"] is not None:
                for r in used:
                    used[r][p["slr"]] += p["need"][r]
            for part in p["need"].get("per_slr", []):   # a unit spanning SLRs
                for r in used:
                    used[r][part["slr"]] += part[r]
        out[b.name] = {
            "board_type": board.name,
            "slrs": [{"index": s.index, "usable_dsp": s.usable_dsp, "usable_bram36": s.usable_bram36,
                      "usable_uram": s.usable_uram, "used_dsp": used["dsp"][s.index],
                      "used_bram36": used["bram36"][s.index], "used_uram": used["uram"][s.index]}
                     for s in board.slrs],
            "units": [{"instance": i, "kernel": kernel_of.get(i, i), **placed[i]} for i in sorted(placed)],
            "oversubscribed": oversubscribed(board, placed),
            "m_axi": ports,
            "network": [{k: v for k, v in port.items() if k not in ("tx", "rx")} | {"tx": len(port["tx"]),
                                                                                    "rx": len(port["rx"])}
                        for _q, port in sorted(net["ports"].get(b.name, {}).items())],
        }
    chans = [{"src": {"board": c["src"][0], "kernel": c["src"][1], "port": c["src"][2],
                      "qsfp": c["src_qsfp"], "socket": c["src_socket"]},
              "dst": {"board": c["dst"][0], "kernel": c["dst"][1], "port": c["dst"][2],
                      "qsfp": c["dst_qsfp"], "socket": c["dst_socket"]},
              "tensor": c["tensor"], "elements": c["elements"], "hops": c["hops"], "stack": c["stack"],
              "udp_port": UDP_BASE + i} for i, c in enumerate(net["channels"])]
    # backward gradients between two stages of one board: a direct stream, no network
    local = [{"board": c["src"][0], "src": f"{c['src'][1]}_1.{c['src'][2]}", "dst": f"{c['dst'][1]}_1.{c['dst'][2]}",
              "src_key": f"{c['src'][1]}_{c['src'][2]}", "dst_key": f"{c['dst'][1]}_{c['dst'][2]}"}
             for c in net["local"]]
    return {"generator": "bapipe gen (codegen.design.placement)", "plan": ctx.fingerprint,
            "boards": out, "channels": chans, "local": local}


#: UDP port of channel i is UDP_BASE + i on both ends (the host fills each network layer's
#: socket table from design.json: theirIP, theirPort = myPort = UDP_BASE + i)
UDP_BASE = 50000


# --- link config lines -----------------------------------------------------------------------


def link_lines(b, placement: dict, channel_list: list[dict], local: list[dict] = ()) -> dict:
    """The board's v++ link config: nk, sp, slr, stream_connect and connect lines, from the
    context's kernels and streams (``b``: codegen.design.context.BoardCtx) and the placement; the
    context's placeholder network endpoints (``net_rx_1`` / ``net_tx_1``) become the framing
    kernel's channel ports, and the network stack's kernels and GT connections are added."""
    nk = list(b.nk)
    slr = [f"{u['instance']}:SLR{u['slr']}" for u in placement["units"] if u["slr"] is not None]
    spans = [f"{u['instance']} needs SLR{u['spans'][0]}-SLR{u['spans'][-1]} "
             f"({u['need']['dsp']:,} DSP, {u['need']['onchip_bytes']:,} on-chip bytes): left unpinned"
             for u in placement["units"] if u["slr"] is None and u["spans"]]
    over = placement.get("oversubscribed")
    if over:
        spans.append(f"OVERSUBSCRIBED: {', '.join(over['units'])} do not fit: the kernels need "
                     f"{over['need_dsp']:,} DSP ({over['usable_dsp']:,} usable) and {over['need_onchip_bytes']:,} "
                     f"on-chip bytes ({over['usable_onchip_bytes']:,} usable); v++ will fail to place them")
    sp = [f"{p['instance']}.{p['arg']}:{p['bank']}" for p in placement["m_axi"]]
    ports = {p["qsfp"]: p for p in placement["network"]}
    rx_of, tx_of = {}, {}
    for c in channel_list:
        if c["src"]["board"] == b.name:
            q = c["src"]["qsfp"]
            tx_of[f"{c['src']['kernel']}_{c['src']['port']}"] = (q, c["src"]["socket"])
        if c["dst"]["board"] == b.name:
            q = c["dst"]["qsfp"]
            rx_of[f"{c['dst']['kernel']}_{c['dst']['port']}"] = (q, c["dst"]["socket"] - ports[q]["tx"])
    direct = {c["src_key"]: c["dst"] for c in local if c["board"] == b.name}
    arrives = {c["dst_key"] for c in local if c["board"] == b.name}
    connects = []
    for line in b.connects:
        src, dst = line.split(":")
        if dst.startswith("net_tx_1.") and dst.split(".", 1)[1] in direct:
            connects.append(f"{src}:{direct[dst.split('.', 1)[1]]}")
            continue
        if src.startswith("net_rx_1.") and src.split(".", 1)[1] in arrives:
            continue    # fed directly by the producer's kernel on this board (above)
        if src.startswith("net_rx_1."):
            key = src.split(".", 1)[1]
            if key not in rx_of:
                continue    # nothing arrives from another board on this port (e.g. the same board)
            q, k = rx_of[key]
            src = f"{nn.net_instance(q)}.{nn.net_rx_port(k)}"
        if dst.startswith("net_tx_1."):
            key = dst.split(".", 1)[1]
            if key not in tx_of:
                continue
            q, k = tx_of[key]
            dst = f"{nn.net_instance(q)}.{nn.net_tx_port(k)}"
        connects.append(f"{src}:{dst}")
    gt = []
    kernels: dict[str, list[str]] = {}
    for q, port in sorted(ports.items()):
        kernels.setdefault(port["kernel"], []).append(port["instance"])
        frm = port["instance"]
        gt_if, refclk, freerun = nn.platform_gt(placement["board_type"], q)
        if port["stack"] == nn.VNX:
            nl, cmac = nn.vnx_netlayer_instance(q), nn.cmac_kernel(q)
            kernels.setdefault(nn.VNX_NETLAYER, []).append(nl)
            kernels.setdefault(cmac, []).append(cmac)
            connects += [f"{frm}.{nn.NET_LINE_OUT}:{nl}.{nn.VNX_FROM_APP}", f"{nl}.{nn.VNX_TO_APP}:{frm}.{nn.NET_LINE_IN}",
                         f"{cmac}.{nn.CMAC_RX}:{nl}.{nn.VNX_FROM_ETH}", f"{nl}.{nn.VNX_TO_ETH}:{cmac}.{nn.CMAC_TX}"]
            gt += [f"{cmac}/{nn.cmac_gt(q)}:{gt_if}", f"{refclk}:{cmac}/{nn.cmac_refclk(q)}",
                   f"{freerun}:{cmac}/{nn.CMAC_FREERUN}"]
        else:
            au = nn.aurora_kernel(q)
            kernels.setdefault(au, []).append(au)
            connects += [f"{frm}.{nn.NET_LINE_OUT}:{au}.{nn.AURORA_TX}", f"{au}.{nn.AURORA_RX}:{frm}.{nn.NET_LINE_IN}"]
            gt += [f"{au}/{nn.AURORA_GT}:{gt_if}", f"{refclk}:{au}/{nn.AURORA_REFCLK}",
                   f"{freerun}:{au}/{nn.AURORA_INIT_CLK}"]
    nk += [f"{k}:{len(v)}:{'.'.join(v)}" for k, v in kernels.items()]
    xo = [f"{k}.xo" for k in kernels]   # the network kernels' objects v++ links beside the stages'
    return {"nk": nk, "sp": sp, "slr": slr, "connects": connects, "gt": gt, "spans": spans, "xo": xo,
            "network": [{"qsfp": q, "stack": p["stack"], "towards": p["towards"], "kernel": p["kernel"],
                         "tx": p["tx"], "rx": p["rx"]} for q, p in sorted(ports.items())]}


def placement_warnings(placement: dict) -> list[str]:
    """One line per board whose kernels do not all fit (what v++ would fail to place)."""
    out = []
    for name, b in sorted(placement.get("boards", {}).items()):
        o = b.get("oversubscribed")
        if o:
            out.append(f"board {name} ({b['board_type']}) is oversubscribed: {', '.join(o['units'])} do not fit "
                       f"(kernels need {o['need_dsp']:,} DSP, {o['usable_dsp']:,} usable, and "
                       f"{o['need_onchip_bytes']:,} on-chip bytes, {o['usable_onchip_bytes']:,} usable; "
                       f"design.json placement)")
    return out


def shared_buffers(ctx) -> list[list[tuple[str, str]]]:
    """The (instance, argument) groups one buffer serves (the manifest's ``buffer`` keys): the
    forward's banked arrays and the update's, the backward's 16-bit weights and the update's,
    the gradient sums of backward, update and all-reduce, a stash of forward and backward. The
    first of a group is the one the placement banks; the others take its bank."""
    out = []
    for s in ctx.stages:
        if s.bwd is None or s.engine is None:
            continue
        fi, bi = f"{s.name}_1", f"{s.bwd.name}_1"
        u = s.update
        ui = f"{u.name}_1" if u else None
        ai = f"{u.allreduce_name}_1" if u and u.replicas > 1 else None
        for b in s.engine.stashes:
            out.append([(fi, b.name)] + [(bi, x) for x in b.ports])
        if u is None:
            continue
        for r, _n in u.roms:
            out.append([(fi, r), (ui, r)])
        bw = {w.name for w in s.bwd.weights}
        for a in u.arrays:
            if a.name in bw:
                out.append([(bi, a.name), (ui, a.name)])
        for g in s.bwd.grad_arrays:
            out.append([(bi, g.name)] + [(ui, f"g_{a.name}") for a in u.arrays if a.grad == g.name]
                       + ([(ai, f"snd_{g.name}"), (ai, g.name)] if ai else []))
    return out
