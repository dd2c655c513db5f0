"""`bapipe check`'s rules: what a board can build, read from a build's generated files.

Inputs are the files `bapipe gen` wrote, never the Design: the kernels' C++ (read by
codegen.check.cxx_scan), the HLS configs (``syn.top``/``syn.file``: which function is which kernel),
the v++ link configs (``nk``: compute units per board; ``slr``: their SLR; ``sp``: each m_axi
argument's memory bank) and plan.yaml (the per-sample time the banks are held to). Each rule
names its source (docs/check.md):

- ``blocks``: per board and per pinned SLR, BRAM36 / URAM / DSP of its compute units within the
  catalog's usable figures (fpga_models.boards; blocks by fpga_models.memory_blocks, UG573);
- ``ii``: every pipelined loop's accesses per cycle to each array, FIFO and m_axi port within the
  ports its banks give (2 per BRAM/URAM bank, UG573; one read and one write a cycle per FIFO and
  per m_axi port, UG1399), so the II it reaches is the II it declares;
- ``dataflow``: one writer and one reader per channel of a DATAFLOW region (UG1399, "dataflow
  canonical form": single-producer-consumer);
- ``masters``: at most 15 kernel interfaces on one memory bank (UG1393 / UG1700, "Mapping
  Kernel Ports to Memory");
- ``bandwidth``: bytes per sample on each bank, at the bank's bandwidth, within the plan's time
  per sample of the stage (the loops whose trip counts the scan knows; the rest are listed).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from bapipe.fpga_models.boards import BOARDS
from bapipe.fpga_models.memory_blocks import PORTS_PER_BANK, Blocks, array_blocks, fifo_impl

from bapipe.codegen.check.cxx_scan import Decl, KernelScan, scan_calls

#: UG1393 / UG1700 "Mapping Kernel Ports to Memory": "Up to 15 separate kernel interfaces can be
#: connected to a given global memory bank"
MAX_MASTERS_PER_BANK = 15
#: declarations a kernel's figures list, largest first (what a reader looks at to shrink a kernel)
LARGEST = 5
#: DSP48E2 multiplier: 27 x 18 bits signed (UG579, "DSP48E2 slice")
DSP_A_BITS, DSP_B_BITS = 27, 18
#: Vitis platform names -> catalog board (the link cfg's ``platform=``)
PLATFORM_BOARDS = (("u250", "U250"), ("u280", "U280"), ("u55c", "U55C"), ("u200", "U200"), ("u50", "U50"))

RULES = {
    "blocks": "BRAM36, URAM and DSP of a board's (and a pinned SLR's) compute units within its usable "
              "resources (UG573 primitive modes; board data sheets via fpga_models.boards)",
    "ii": "accesses per cycle of every pipelined loop within the ports of what it touches (UG573: 2 per "
          "BRAM/URAM bank; UG1399: 1 read + 1 write per FIFO and per m_axi port)",
    "dataflow": "one writer and one reader per DATAFLOW channel (UG1399, dataflow canonical form)",
    "masters": f"at most {MAX_MASTERS_PER_BANK} kernel interfaces per memory bank (UG1393, Mapping Kernel "
               "Ports to Memory)",
    "bandwidth": "bytes per sample on each memory bank at its bandwidth within the plan's time per sample",
}


def dsp_per_multiplier(a: int, b: int) -> int:
    """DSP48E2 slices of one a x b-bit product: the 27 x 18 multiplier tiled, best orientation."""
    if a <= 0 or b <= 0:
        return 0
    return min(math.ceil(a / DSP_A_BITS) * math.ceil(b / DSP_B_BITS),
               math.ceil(b / DSP_A_BITS) * math.ceil(a / DSP_B_BITS))


# --- one declaration ------------------------------------------------------------------------


def _factor(kind: str, factor: int, size: int) -> int:
    return size if kind == "complete" else max(1, min(factor or 1, size))


def layout(d: Decl) -> tuple[str, int, int, int, int]:
    """(impl, banks, bank width bits, bank depth, elements per access) of an array or FIFO."""
    if d.kind == "stream":
        count = d.elements if d.dims else 1
        return fifo_impl(d.elem_bits, d.depth, d.impl), count, d.elem_bits, d.depth, 1
    dims = list(d.dims) or [1]
    banks, width, per_access = 1, d.elem_bits, 1
    complete = set()
    for kind, factor, dim in d.partitions:
        for k in (range(len(dims)) if dim == 0 else [dim - 1]):
            if k < len(dims):
                f = _factor(kind, factor, dims[k])
                banks *= f
                if f == dims[k]:
                    complete.add(k)
    for kind, factor, dim in d.reshapes:
        for k in (range(len(dims)) if dim == 0 else [dim - 1]):
            if k < len(dims):
                f = _factor(kind, factor, dims[k])
                width *= f
                per_access *= f
    if len(complete) == len(dims):
        return "register", banks, width, 1, per_access
    depth = math.ceil(d.elements / banks / per_access)
    impl = d.impl if d.impl in ("bram", "uram", "lutram", "srl") else "auto"
    return impl, banks, width, depth, per_access


def decl_blocks(d: Decl) -> Blocks:
    """The blocks one array or FIFO takes (fpga_models.memory_blocks)."""
    if d.kind not in ("array", "stream"):
        return Blocks()
    impl, banks, width, depth, _ = layout(d)
    return array_blocks(impl, width, banks * depth, banks)


def reach_ii(loop, decls: dict[str, Decl]) -> tuple[int, str | None]:
    """The II the loop's accesses allow (at least its declared II) and the declaration that sets it."""
    best, why = loop.ii, None
    for did, (r, w) in loop.access.items():
        d = decls.get(did)
        if d is None:
            continue
        if d.kind in ("stream", "axis"):
            need = max(r, w)
        elif d.kind == "m_axi":
            per_beat = max(1, d.widen_bits // d.elem_bits) if d.widen_bits and d.elem_bits else 1
            need = max(math.ceil(r / per_beat), math.ceil(w / per_beat))
        else:
            impl, banks, _, _, per = layout(d)
            if impl == "register":
                continue
            need = math.ceil((r + w) / (banks * PORTS_PER_BANK * per))
        if need > best:
            best, why = need, did
    return best, why


# --- one kernel ------------------------------------------------------------------------------


@dataclass
class KernelFigures:
    """What one kernel (one compute unit of it) takes and where it breaks a rule."""

    kernel: str
    file: str
    blocks: Blocks
    dsp: int
    loops: int
    ii_violations: list[dict]
    dataflow_violations: list[dict]
    bundles: dict[str, str]                  # m_axi argument -> bundle
    traffic: dict[str, float]                # m_axi argument -> bytes per sample (priced loops)
    unpriced_loops: int
    largest: list[dict] = field(default_factory=list)
    call_traffic: dict[str, float] = field(default_factory=dict)   # m_axi argument -> bytes once a call
    takes_n: bool = False                    # called with n samples (forward, backward, movers)
    call_cycles: int = 0                     # cycles of one call's pipelined loops (n = 1)
    flush_traffic: dict[str, float] = field(default_factory=dict)   # m_axi argument -> bytes once an iteration

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "file": self.file, **self.blocks.to_dict(), "dsp": self.dsp,
                "pipelined_loops": self.loops, "ii_violations": self.ii_violations,
                "dataflow_violations": self.dataflow_violations, "m_axi_bytes_per_sample": self.traffic,
                "m_axi_bytes_per_call": self.call_traffic, "takes_n": self.takes_n,
                "m_axi_bytes_per_flush": self.flush_traffic,
                "call_cycles": self.call_cycles, "unpriced_loops": self.unpriced_loops, "largest": self.largest}


def _port_traffic(scan: KernelScan) -> tuple[dict[str, float], int]:
    """m_axi argument -> bytes of one call (the priced loops), and how many loops with m_axi
    accesses have trip counts the scan does not know."""
    traffic, unpriced = {}, 0
    for lp in scan.loops:
        if lp.iterations is None:
            unpriced += any(scan.decls.get(x) is not None and scan.decls[x].kind == "m_axi" for x in lp.access)
            continue
        for did, (r, w) in lp.access.items():
            d = scan.decls.get(did)
            if d is not None and d.kind == "m_axi":
                port = did.split(":", 1)[1]
                traffic[port] = traffic.get(port, 0.0) + (r + w) * d.elem_bits / 8 * lp.iterations
    return traffic, unpriced


def _call_cycles(scan: KernelScan) -> int:
    """Cycles of one call: its pipelined loops' iterations x II, in sequence (a kernel with a
    DATAFLOW region: its longest loop, the processes overlapping)."""
    cyc = [lp.iterations * lp.ii for lp in scan.loops if lp.iterations]
    if not cyc:
        return 0
    return max(cyc) if scan.dataflows else sum(cyc)


def _scans(files, file: str, top: str) -> list:
    """The kernel scanned whole (every branch: blocks, II, DATAFLOW, DSP), then for its traffic:
    calls of one and two samples that do not flush, and the flush call of no samples."""
    whole = scan_calls(files, file, top, [(1, None)])[0]
    if not whole.takes_n:
        return [whole]
    calls = [(1, 0), (2, 0)] + ([(0, 1)] if whole.takes_flush else [])
    return [whole, *scan_calls(files, file, top, calls)]


def kernel_figures(scan: KernelScan, one: KernelScan | None = None, two: KernelScan | None = None,
                   flush: KernelScan | None = None, file: str = "") -> KernelFigures:
    """Blocks, DSP, II and DATAFLOW findings of one scanned kernel (``scan``: every branch).
    Traffic: ``one`` and ``two``, the kernel scanned for calls of one and two samples that do not
    flush: what grows with ``n`` is per sample, the rest is paid once a call (weight copies);
    ``flush``: the call that ends an iteration (the weight-gradient sums written once)."""
    total, sized = Blocks(), []
    for d in scan.decls.values():
        b = decl_blocks(d)
        total = total + b
        if b.bram18 or b.uram:
            sized.append((b.uram * 8 + b.bram18, d, b))
    dsp, ii_bad = 0, []
    for lp in scan.loops:
        dsp += sum(dsp_per_multiplier(a, b) for a, b in lp.mults)
        reach, why = reach_ii(lp, scan.decls)
        if reach > lp.ii:
            r, w = lp.access[why]
            ii_bad.append({"loop": f"{lp.path}:{lp.label}", "declared_ii": lp.ii, "reachable_ii": reach,
                           "by": why, "reads": r, "writes": w})
    whole, unpriced = _port_traffic(scan)
    traffic, call, per_flush = {}, whole, {}
    if one is not None and two is not None:
        t1, t2 = _port_traffic(one)[0], _port_traffic(two)[0]
        traffic = {p: t2.get(p, 0.0) - t1.get(p, 0.0) for p in sorted(set(t1) | set(t2))}
        call = {p: t1.get(p, 0.0) - traffic[p] for p in traffic}
        per_flush = _port_traffic(flush)[0] if flush is not None else {}
    df_bad = []
    for df in scan.dataflows:
        for did, uses in df.channels.items():
            d = scan.decls.get(did)
            if d is None or d.kind not in ("stream", "array"):
                continue
            writers = [p for p, u in uses if "w" in u]
            readers = [p for p, u in uses if "r" in u]
            if len(writers) > 1 or len(readers) > 1:
                df_bad.append({"region": df.path, "channel": did, "writers": len(writers), "readers": len(readers)})
    sized.sort(key=lambda x: -x[0])
    largest = [{"decl": d.id, "impl": layout(d)[0], "banks": layout(d)[1], **b.to_dict()} for _, d, b in sized[:LARGEST]]
    bundles = {did.split(":", 1)[1]: d.bundle for did, d in scan.decls.items() if d.kind == "m_axi"}
    return KernelFigures(scan.kernel, file, total, dsp, len(scan.loops), ii_bad, df_bad, bundles,
                         {p: v for p, v in traffic.items() if v}, unpriced, largest,
                         {p: v for p, v in call.items() if v}, scan.takes_n, _call_cycles(scan),
                         {p: v for p, v in per_flush.items() if v})


# --- the build -------------------------------------------------------------------------------


@dataclass
class LinkConfig:
    board: str
    board_type: str
    kernels: dict[str, list[str]]        # kernel -> compute units
    slr: dict[str, int]                  # compute unit -> SLR
    sp: dict[str, str]                   # "cu.arg" -> bank


def read_link(path: Path) -> LinkConfig:
    """The parts of a v++ link config the rules read."""
    text = path.read_text(encoding="utf-8")
    m = re.search(r"link config for board (\S+) \((\w+)\)", text)
    board = m.group(1) if m else path.stem
    btype = m.group(2) if m else None
    pm = re.search(r"^platform=(\S+)", text, re.M)
    if btype is None and pm:
        btype = next((b for key, b in PLATFORM_BOARDS if key in pm.group(1)), None)
    kernels, slr, sp = {}, {}, {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("nk="):
            parts = line[3:].split(":")
            kernels[parts[0]] = parts[2].split(".") if len(parts) > 2 else [f"{parts[0]}_{i + 1}"
                                                                              for i in range(int(parts[1]))]
        elif line.startswith("slr="):
            cu, s = line[4:].split(":")
            slr[cu] = int(s.replace("SLR", ""))
        elif line.startswith("sp="):
            port, bank = line[3:].rsplit(":", 1)
            sp[port] = bank
    return LinkConfig(board, btype or "?", kernels, slr, sp)


def kernel_sources(build: Path) -> dict[str, tuple[str, str]]:
    """kernel name -> (C++ file relative to the build, top function): each HLS config's syn.top and
    syn.file, and the common data movers (mm2s, s2mm) named by their file."""
    out = {}
    for cfg in sorted(build.glob("*/hls_config*.cfg")):
        text = cfg.read_text(encoding="utf-8")
        top = re.search(r"^syn\.top=(\S+)", text, re.M)
        src = re.search(r"^syn\.file=(\S+)", text, re.M)
        if top and src:
            out[top.group(1)] = (f"{cfg.parent.name}/{src.group(1)}", top.group(1))
    for cpp in sorted(build.glob("common/*.cpp")):
        out.setdefault(cpp.stem, (f"common/{cpp.name}", cpp.stem))
    return out


def _files(build: Path) -> dict[str, str]:
    return {p.relative_to(build).as_posix(): p.read_text(encoding="utf-8")
            for p in build.rglob("*") if p.suffix in (".cpp", ".h") and "csim" not in p.parts and p.is_file()}


def _plan_times(build: Path) -> dict[str, tuple[float, int, int]]:
    """board -> (the plan's seconds per sample of the stages it runs, the samples of one call of
    its stage kernels, the calls an iteration). A stage's fwd_s and bwd_s are one replica's micro-batch of
    ceil(microbatch_size / replicas) samples (codegen.design.backward.replica_batch: the ``n`` the
    host passes); a board running several stages (interleaved chunks) adds their times."""
    import yaml

    try:
        plan = yaml.safe_load((build / "plan.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return {}
    size = max(1, int(plan.get("microbatch_size") or 1))
    m = max(1, int(plan.get("microbatches") or 1))
    out: dict[str, tuple[float, int, int]] = {}
    for st in plan.get("stages") or []:
        mb = max(1, math.ceil(size / max(1, int(st.get("replicas") or 1))))
        t = (float(st.get("fwd_s") or 0) + float(st.get("bwd_s") or 0)) / mb
        for b in st.get("boards") or []:
            prev = out.get(b, (0.0, mb, m))
            out[b] = (prev[0] + t, min(prev[1], mb), m)
    return out


def check_build(build: str | Path) -> dict:
    """Every rule on every board of ``build``; the ``--json`` object of `bapipe check`."""
    build = Path(build)
    files = _files(build)
    sources = kernel_sources(build)
    links = [read_link(p) for p in sorted((build / "link").glob("*.cfg"))]
    times = _plan_times(build)
    figures: dict[str, KernelFigures] = {}
    boards, failed = [], set()
    for link in links:
        board = _board_check(link, sources, files, figures, times.get(link.board))
        failed |= {r for r, ok in board["rules"].items() if not ok}
        boards.append(board)
    return {"build": str(build), "ok": not failed, "failed_rules": sorted(failed), "rules": RULES,
            "boards": boards, "kernels": {k: f.to_dict() for k, f in sorted(figures.items())}}


def _board_check(link: LinkConfig, sources, files, figures, plan_time) -> dict:
    spec = BOARDS.get(link.board_type)
    per_slr: dict[int, list] = {}
    total, dsp, not_read = Blocks(), 0, []
    cu_kernel = {}
    for kernel, cus in link.kernels.items():
        if kernel not in sources:
            not_read.append(kernel)
            for cu in cus:
                cu_kernel[cu] = None
            continue
        if kernel not in figures:
            file, top = sources[kernel]
            figures[kernel] = kernel_figures(*_scans(files, file, top), file=file)
        f = figures[kernel]
        for cu in cus:
            cu_kernel[cu] = kernel
            total, dsp = total + f.blocks, dsp + f.dsp
            if cu in link.slr:
                acc = per_slr.setdefault(link.slr[cu], [Blocks(), 0])
                acc[0], acc[1] = acc[0] + f.blocks, acc[1] + f.dsp
    over = []
    if spec is not None:
        for name, have, cap in (("bram36", total.bram36, spec.usable_bram36), ("uram", total.uram, spec.usable_uram),
                                ("dsp", dsp, spec.usable_dsp)):
            if have > cap:
                over.append(f"{name} {have:,.0f} > {cap:,}")
        for k, (b, d) in sorted(per_slr.items()):
            if k < len(spec.slrs):
                s = spec.slrs[k]
                for name, have, cap in (("bram36", b.bram36, s.usable_bram36), ("uram", b.uram, s.usable_uram),
                                        ("dsp", d, s.usable_dsp)):
                    if have > cap:
                        over.append(f"SLR{k} {name} {have:,.0f} > {cap:,}")
    time_s, mb, calls = plan_time if plan_time else (None, 1, 1)
    masters, traffic, per_call = {}, {}, {}
    for port, bank in link.sp.items():
        cu, arg = port.split(".", 1)
        kernel = cu_kernel.get(cu)
        bundle = figures[kernel].bundles.get(arg, arg) if kernel else arg
        masters.setdefault(bank, set()).add((cu, bundle))
        if not kernel:
            continue
        f = figures[kernel]
        if f.takes_n:   # per sample; what a call of mb samples pays once; what the iteration's flush writes
            traffic[bank] = (traffic.get(bank, 0.0) + f.traffic.get(arg, 0.0) + f.call_traffic.get(arg, 0.0) / mb
                             + f.flush_traffic.get(arg, 0.0) / (mb * calls))
        elif f.call_traffic.get(arg):   # once an iteration (update, all-reduce): within its own loops' time
            per_call.setdefault(cu, {}).setdefault(bank, 0.0)
            per_call[cu][bank] += f.call_traffic[arg]
    masters_n = {b: len(s) for b, s in sorted(masters.items())}
    bank_time = {}
    for bank, nbytes in sorted(traffic.items()):
        bk = spec.bank(bank) if spec is not None else None
        if bk is not None:
            bank_time[bank] = nbytes / bk.bw_Bps
    call_time = {}
    for cu, banks in sorted(per_call.items()):
        f = figures[cu_kernel[cu]]
        own = f.call_cycles / spec.clock_hz if spec is not None else None
        for bank, nbytes in sorted(banks.items()):
            bk = spec.bank(bank) if spec is not None else None
            if bk is not None and own is not None:
                call_time[f"{cu}@{bank}"] = {"bytes": round(nbytes), "bank_s": nbytes / bk.bw_Bps, "kernel_s": own}
    kernels = sorted({k for k in cu_kernel.values() if k})
    rules = {
        "blocks": not over and spec is not None,
        "ii": not any(figures[k].ii_violations for k in kernels),
        "dataflow": not any(figures[k].dataflow_violations for k in kernels),
        "masters": all(n <= MAX_MASTERS_PER_BANK for n in masters_n.values()),
        "bandwidth": (time_s is None or all(t <= time_s for t in bank_time.values()))
                     and all(c["bank_s"] <= c["kernel_s"] for c in call_time.values()),
    }
    return {"board": link.board, "board_type": link.board_type, **total.to_dict(), "dsp": dsp,
            "usable": ({"bram36": spec.usable_bram36, "uram": spec.usable_uram, "dsp": spec.usable_dsp}
                       if spec else None),
            "slrs": {f"SLR{k}": {**b.to_dict(), "dsp": d} for k, (b, d) in sorted(per_slr.items())},
            "over": over, "masters_per_bank": masters_n,
            "bank_bytes_per_sample": {b: round(v) for b, v in sorted(traffic.items())},
            "bank_seconds_per_sample": bank_time, "plan_seconds_per_sample": time_s,
            "samples_per_call": mb, "per_call_kernels": call_time,
            "kernels": kernels, "not_read": sorted(not_read),
            "ii_violations": sum(len(figures[k].ii_violations) for k in kernels),
            "dataflow_violations": sum(len(figures[k].dataflow_violations) for k in kernels),
            "rules": rules}


def summary_lines(result: dict) -> list[str]:
    """One line per board."""
    out = []
    for b in result["boards"]:
        u = b["usable"] or {}
        bad = [r for r, ok in b["rules"].items() if not ok]
        worst = max(b["masters_per_bank"].items(), key=lambda x: x[1], default=("-", 0))
        out.append(f"{b['board']} ({b['board_type']}): BRAM36 {b['bram36']:,.0f}/{u.get('bram36', '?'):,} "
                   f"URAM {b['uram']:,}/{u.get('uram', '?'):,} DSP {b['dsp']:,}/{u.get('dsp', '?'):,}, "
                   f"masters {worst[1]} on {worst[0]}, II violations {b['ii_violations']}, "
                   f"DATAFLOW violations {b['dataflow_violations']}: "
                   + ("ok" if not bad else "FAILS " + ", ".join(bad)))
    return out
