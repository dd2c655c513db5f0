"""How close a plan comes to its boards' peak, and the one resource that holds it back
(docs/planner.md, "What limits a plan").

DSP roofline (samples/s) = sum over the planner's boards of physical DSP x kernel clock x
MACs per DSP (fixed16: one MAC per DSP; a format's MACs per DSP = 1 / Board.dsp_per_mac),
divided by the model's MACs per sample (training: forward + backward, as `bapipe profile`
counts them; inference: forward). The fraction reached = planned samples/s / roofline.
Off-chip roofline = global batch / the longest off-chip busy time of a pipeline position per
iteration (planner.breakdown's ``ddr_busy_s``): what the plan's DDR traffic alone allows.
"""
from __future__ import annotations

from bapipe.fpga_models.boards import Board


def peak_macs_per_s(board: Board, fmt: str) -> float:
    """Physical DSP x kernel clock x MACs per DSP of ``board`` in ``fmt`` (fixed16: 1)."""
    return board.dsp * board.clock_hz / board.dsp_per_mac.get(fmt, 1.0)


def roofline(model, boards, fmt: str, train: bool, global_batch: int, iteration_s: float,
             positions: list[dict]) -> dict:
    """The plan's throughput against the DSP roofline of ``boards`` (cluster boards the planner
    may use) and the off-chip roofline of its positions (planner.breakdown). The DSP figures
    are None on a cluster with GPUs (no DSPs to count)."""
    macs = model.fwd_macs + (model.bwd_macs if train else 0)
    thr = global_batch / iteration_s
    fpga = all(cb.board.kind == "fpga" for cb in boards)
    peak = sum(peak_macs_per_s(cb.board, fmt) for cb in boards) if fpga else None
    dsp_roof = peak / macs if peak and macs else None
    ddr = max((q["ddr_busy_s"] for q in positions), default=0.0)
    mem_roof = global_batch / ddr if ddr > 0 else None
    bound = "dsp" if mem_roof is None or (dsp_roof is not None and dsp_roof <= mem_roof) else "offchip"
    if dsp_roof is None and mem_roof is None:
        bound = None
    return {"macs_per_sample": macs, "boards": len(boards), "peak_macs_per_s": peak,
            "throughput_samples_per_s": thr,
            "dsp_roofline_samples_per_s": dsp_roof, "fraction": thr / dsp_roof if dsp_roof else None,
            "offchip_roofline_samples_per_s": mem_roof,
            "offchip_fraction": thr / mem_roof if mem_roof else None, "bound": bound}


def limit(positions: list[dict], iteration_s: float) -> dict:
    """The one resource that limits the plan, on the position that idles least (the one the
    others wait for): the largest of its engines' time (compute + fills: DSP), its DDR's busy
    time (``ddr_busy_s``: a DDR bank), its off-chip waits when they outlast that busy time (the
    data waited for does not fit on chip: BRAM/URAM), its link waits and its all-reduce (a link).
    A GPU position limited by its own time says "GPU compute" (it has no DSPs)."""
    crit = min(positions, key=lambda q: (q["bubble_s"], q["position"]))
    waits = crit["offchip_s"] if crit["offchip_s"] > crit["ddr_busy_s"] else 0.0
    score = {"compute": crit["compute_s"] + crit["fills_s"], "offchip": crit["ddr_busy_s"], "onchip": waits,
             "link": crit["link_s"], "allreduce": crit["allreduce_s"]}
    part = max(score, key=lambda k: (score[k], -list(score).index(k)))
    b = crit["boards"][0]
    if crit.get("board_kind") == "gpu" and part == "compute":   # no DSPs: the GPU's arithmetic
        return {"resource": "GPU compute", "position": crit["position"], "stages": crit["stages"], "part": part,
                "share": score[part] / iteration_s if iteration_s else 0.0, "where": f"the arithmetic units of {b}"}
    res, where = {
        "compute": ("DSP", f"the MAC arrays of {b} ({crit['compute_s'] / iteration_s:.0%} compute, "
                           f"{crit['fills_s'] / iteration_s:.0%} fills)"),
        "offchip": ("DDR bank", f"{b}'s DDR is busy {crit['ddr_busy_s'] / iteration_s:.0%} of the iteration "
                                f"(its engines wait on it {crit['offchip_s'] / iteration_s:.0%})"),
        "onchip": ("BRAM/URAM", f"{b} waits {waits / iteration_s:.0%} of the iteration on data that does not fit "
                                f"on chip, longer than its DDR is busy"),
        "link": ("link", f"the links between {b} and its pipeline neighbours"),
        "allreduce": ("link", f"the all-reduce ring of {', '.join(crit['boards'])}"),
    }[part]
    return {"resource": res, "position": crit["position"], "stages": crit["stages"], "part": part,
            "share": score[part] / iteration_s if iteration_s else 0.0, "where": where}
