"""Training RTL, rendered: the per-board training engines, sequencers and stashes of a
TrainDesign (codegen.design.training decides them), written to ``rtl/train/`` with its manifest
and the design.json ``train`` record."""
from __future__ import annotations

import numpy as np

from bapipe.fpga_models import train_fixed as tfx

from bapipe.codegen.design.dataflow import clog2
from bapipe.codegen.design.unsupported import Unsupported
from bapipe.codegen.design.training import (LEARNING_RATE, MOMENTUM, TRAINED_KINDS, WEIGHT_KINDS, TrainBoard,
                                            TrainDesign, from_tile_order, hex_lines, read_hex, tile_order,
                                            train_reference, weight_matrix)

def _board_ctx(td: TrainDesign, b: TrainBoard, first: bool, last: bool, in_lanes: int, out_lanes: int) -> dict:
    steps = b.steps()
    nf_ = sum(1 for s in steps if s[0] == "F")
    nb_ = sum(1 for s in steps if s[0] == "B")
    beta = b.beta
    base_w = clog2(b.stashes)
    slot_w = clog2(b.stashes * beta)
    nops = len(b.ops)
    kinds = "".join("1" if k == "B" else "0" for k, _ in reversed(b.ops))
    slots = [mb % b.stashes for _, mb in b.ops]
    mbv = 0
    for i, s in enumerate(slots):
        mbv |= s << (i * base_w)
    index = {inst: k for k, (_ph, inst, _c) in enumerate(steps)}
    layers = []
    for l in b.layers:
        d = {"step": {sfx: index[f"{l.ident}_{sfx}"] for sfx in ("f", "bi", "bw", "b") if f"{l.ident}_{sfx}" in index},
             "ident": l.ident, "kind": l.kind, "n_in": l.n_in, "n_out": l.n_out, "pe": l.pe, "simd": l.simd,
             "lanes": l.lanes, "mh": l.mh, "mw": l.mw, "g": l.geom, "nb": int(l.bias)}
        if l.kind in WEIGHT_KINDS:
            d["addr_w"] = clog2(max(2, (l.mh // l.pe) * (l.mw // l.simd)))
        elif l.kind in ("maxpool", "avgpool", "globalavgpool"):
            from bapipe.fpga_models.fixedpoint import AVG_BITS, avg_recip
            d.update(f_cycles=l.fwd_cycles, b_cycles=l.bwd_in_cycles, f_ipc=-(-l.n_out // l.fwd_cycles),
                     b_ipc=-(-l.n_in // l.bwd_in_cycles), recip=avg_recip(l.geom["k"] ** 2), avg_bits=AVG_BITS,
                     mode=0 if l.kind == "maxpool" else 1)
        else:
            d["cnt_w"] = clog2(max(2, -(-l.n_in // l.lanes)))
        if b.ring:
            d["ar_off"] = b.ring["offsets"].get(l.ident, 0)
        from bapipe.codegen.design.train_dag import board_ctx
        d.update(board_ctx(b.layers, l))
        layers.append(d)
    smp_w = clog2(beta + 1)
    units = _unit_wiring(b, smp_w, slot_w)
    for d, l in zip(layers, b.layers):
        d.update(units.get(l.ident, {}))
    n_f, n_u = len(b.engine_layers), len(b.bwd_units())
    # bit k = backward unit k (MSB first): two engines, a weighted layer's dx then dW
    two = "".join("1" if part == "b" and units[l.ident]["two"] else "0" for l, part in b.bwd_units()[::-1])
    return {
        "module": b.module, "board": b.name, "layers": layers, "steps": [{"phase": ph, "inst": i} for ph, i, _ in steps],
        "n_f": n_f, "n_u": n_u, "two": f"{n_u}'b{two}", "serial": int(b.serial),
        "f_fill": _fills_literal(b.unit_fills("F")), "b_fill": _fills_literal(b.unit_fills("B")),
        "overlap": beta > 1 and not b.serial, "n_b": nb_, "step_w": clog2(max(2, len(steps))),
        "nops": nops, "op_w": clog2(nops + 1), "kinds": f"{nops}'b{kinds}",
        "slots": f"{nops * base_w}'h{mbv:0{(nops * base_w + 3) // 4}x}", "slot_w": slot_w, "stashes": b.stashes,
        "beta": beta, "base_w": base_w, "smp_w": smp_w, "idx_w": clog2(beta),
        "in_elems": b.in_elems, "out_elems": b.out_elems, "in_lanes": in_lanes, "out_lanes": out_lanes,
        "depth": td.microbatches * beta, "ptr_w": clog2(td.microbatches * beta),
        "in_beat_w": clog2(max(2, b.in_elems // in_lanes)), "out_beat_w": clog2(max(2, b.out_elems // out_lanes)),
        "elem_w": td.elem_w, "frac": td.frac, "acc_w": td.acc_w, "mu_q": td.consts.mu,
        "lr_steps": len(td.sgd.steps), "lr_period": td.sgd.period, "lr_table": td.lr_table,
        "lr_shift": td.consts.shift, "mu_frac": tfx.MU_FRAC, "mst_w": td.tf.master.width,
        "mst_shift": td.tf.master.frac - td.tf.act.frac, "vel_w": td.tf.vel.width,
        "first": first, "last": last, "iter_w": 16,
        "ar": b.ring, "name_sfx": _name_sfx(b),
    }


def _fills_literal(fills: list[int]) -> str:
    """A unit fill list as the sequencer's F_FILL / B_FILL parameter (8 bits a unit, unit 0 lowest)."""
    if any(not 0 <= f < 256 for f in fills):
        raise Unsupported(f"unit fills {fills} do not fit the sequencer's 8 bits")
    v = 0
    for u, f in enumerate(fills):
        v |= f << (8 * u)
    return f"{8 * len(fills)}'h{v:0{2 * len(fills)}x}"


def _unit_wiring(b: TrainBoard, smp_w: int, slot_w: int) -> dict:
    """Per engine layer of a board, the sequencer signals its engines use (Verilog expressions):
    forward unit u = the u-th engine layer, backward unit k = the k-th of ``TrainBoard.bwd_units``
    (per layer from the last: a forked layer's gradient sum, then the layer's own backward);
    ``go`` / ``dn``: each engine's start and done; ``src``: the forward unit whose output is the
    layer's input (None: the board's input), ``dst`` / ``dst_done``: the backward unit whose
    output is the layer's output gradient (its reader's, or its own fork sum's; None: the board's
    gradient input) and its done; ``fslot`` / ``bslot``: the stash slot of the sample in the
    forward / backward unit (``fs_slot``: in the fork sum's unit); ``fidx`` / ``bidx``: the
    sample's index in the micro-batch's buffers (``src_idx``, ``dst_idx``: the producers');
    ``last``: the iteration's last backward sample of the layer."""
    eng = b.engine_layers
    idx_w = clog2(b.beta)
    kidx = {(l.ident, part): k for k, (l, part) in enumerate(b.bwd_units())}
    out = {}
    from bapipe.codegen.design.train_dag import unit_graph
    prod, reads = unit_graph(b)

    def two_of(t) -> bool:
        """Two engines a backward unit: a weighted layer's dx, then its dW."""
        return t.kind in WEIGHT_KINDS and t.dx

    def bdone(t):
        kt = kidx[(t.ident, "b")]
        return ("b2_done" if two_of(t) else "b1_done") + f"[{kt}]"

    for u, l in enumerate(eng):
        k = kidx[(l.ident, "b")]
        kf = kidx.get((l.ident, "fs"))
        two = two_of(l)
        f = {"f": f"f_start[{u}]"}
        fd = {"f": f"f_done[{u}]"}
        if l.kind in WEIGHT_KINDS:
            if two:
                go, dn = {"bi": f"b1_start[{k}]", "bw": f"b2_start[{k}]"}, {"bi": f"b1_done[{k}]", "bw": f"b2_done[{k}]"}
            else:
                go, dn = {"bw": f"b1_start[{k}]"}, {"bw": f"b1_done[{k}]"}
        else:
            go, dn = {"b": f"b1_start[{k}]"}, {"b": f"b1_done[{k}]"}
        if kf is not None:                                    # the fork's gradient sum: its own unit
            go["fs"], dn["fs"] = f"b1_start[{kf}]", f"b1_done[{kf}]"
        bsmp = f"b_smp[{k * smp_w} +: {smp_w}]"
        src = prod(l.inputs[0]) if l.inputs else (u - 1 if u > 0 else None)   # the unit whose output it reads
        rd = reads(l.name)                                    # the units reading its output
        if len(rd) == 1:                                      # its reader's input gradient
            kd, dst_done = kidx[(eng[rd[0]].ident, "b")], bdone(eng[rd[0]])
        elif kf is not None:                                  # a fork: the sum of its readers' gradients
            kd, dst_done = kf, f"b1_done[{kf}]"
        else:
            kd, dst_done = None, None
        out[l.ident] = {
            "fu": u, "bu": k, "fsu": kf, "two": two, "go": {**f, **go}, "dn": {**fd, **dn},
            "src": src,
            "src_slot": f"f_slot[{(src or 0) * slot_w} +: {slot_w}]",
            "dst": kd,
            "dst_done": dst_done,
            "fslot": f"f_slot[{u * slot_w} +: {slot_w}]", "bslot": f"b_slot[{k * slot_w} +: {slot_w}]",
            "fs_slot": None if kf is None else f"b_slot[{kf * slot_w} +: {slot_w}]",
            # a sample's index in a buffer of the micro-batch (its values < beta need idx_w bits)
            "fidx": f"f_smp[{u * smp_w} +: {idx_w}]", "bidx": f"b_smp[{k * smp_w} +: {idx_w}]",
            "src_idx": f"f_smp[{(src or 0) * smp_w} +: {idx_w}]", "dst_idx": f"b_smp[{(kd or 0) * smp_w} +: {idx_w}]",
            # a residual add's second input and a fork's two gradients (codegen.design.train_dag)
            **({"src2_done": f"f_done[{prod(l.inputs[1])}]",
                "src2_slot": f"f_slot[{prod(l.inputs[1]) * slot_w} +: {slot_w}]"} if l.kind == "add" else {}),
            **({"fk": [{"done": bdone(eng[r]), "slot": f"b_slot[{kidx[(eng[r].ident, 'b')] * slot_w} +: {slot_w}]"}
                       for r in (rd[1], rd[0])]} if len(rd) == 2 else {}),
            "stash": l.kind not in ("avgpool", "add"),
            "last": f"last_op && {bsmp} == {smp_w}'d{b.beta - 1}",
        }
    return out


def _name_sfx(b) -> str:
    """Suffix of a replica board's weight files and dumps (``_r<rank>``; none unreplicated)."""
    return f"_r{b.rank}" if b.replicas > 1 else ""


def render_train(td: TrainDesign, plan_hash: str = "none") -> dict[str, str]:
    """Verilog of the training cluster: generic engines, a top per board, the cluster top and
    the weight images (``<layer>_w.hex`` in tile order, ``<layer>_b.hex``)."""
    from bapipe.codegen.rtl.env import render_template

    files: dict[str, str] = {}
    kinds = {l.kind for b in td.boards for l in b.layers}
    engines_of = {"dense": ("train_mvu_fwd", "mvu_bwd_in", "mvu_bwd_w", "sgd_update"),
                  "conv2d": ("train_conv_fwd", "conv_bwd_in", "conv_bwd_w", "sgd_update"),
                  "relu": ("train_relu",), "maxpool": ("train_pool",), "avgpool": ("train_pool",),
                  "globalavgpool": ("train_pool",), "batchnorm": ("train_batchnorm", "sgd_update"),
                  "add": ("train_add",)}
    needed = {"stash_mem", "train_vec_rx", "train_vec_tx", "train_sequencer"}
    needed.update(n for k in kinds for n in engines_of.get(k, ()))
    if any(l.fork_cycles for b in td.boards for l in b.layers):
        needed.add("train_add")
    for name in sorted(needed):
        files[f"{name}.v"] = render_template(name, plan_hash)
    if td.links or td.rings:             # a replicated one-stage plan has ring hops only
        from bapipe.codegen.rtl.env import TRANSPORT
        files.update({f"{name}.v": render_template(name, plan_hash) for name in TRANSPORT})
    if td.replicas > 1:
        files["train_allreduce.v"] = render_template("train_allreduce", plan_hash)
    if td.turns:
        files["train_turns.v"] = render_template("train_turns", plan_hash)
    turn_of = {i: (t["device"], t["boards"].index(i)) for t in td.turns for i in t["boards"]}
    p_ = td.stages
    ctxs = []
    for i, b in enumerate(td.boards):
        first, last = i % p_ == 0, i % p_ == p_ - 1
        in_lanes = b.in_elems if first else td.link_lanes[td.link_index(i - 1)]
        out_lanes = b.out_elems if last else td.link_lanes[td.link_index(i)]
        ctx = _board_ctx(td, b, first, last, in_lanes, out_lanes)
        ctx["turn"] = {"dev": turn_of[i][0], "c": turn_of[i][1]} if i in turn_of else None
        ctxs.append(ctx)
        files[f"{b.module}.v"] = render_template("train_board", plan_hash, **ctx)
        for l in b.layers:
            if l.kind in WEIGHT_KINDS:
                p = td.params[l.name]
                files[f"{l.ident}{_name_sfx(b)}_w.hex"] = hex_lines(tile_order(weight_matrix(p["w"]), l.pe, l.simd), td.elem_w)
                files[f"{l.ident}{_name_sfx(b)}_b.hex"] = hex_lines(p["b"], td.elem_w)
            elif l.kind == "batchnorm":       # scale and shift: the update's weights and biases
                p = td.params[l.name]
                files[f"{l.ident}{_name_sfx(b)}_w.hex"] = hex_lines(p["scale"], td.elem_w)
                files[f"{l.ident}{_name_sfx(b)}_b.hex"] = hex_lines(p["shift"], td.elem_w)
    links = []
    for i, (l, t, (src, dst)) in enumerate(zip(td.links, td.transports, td.pairs)):
        bw = l.bytes_per_cycle
        links.append({"src": src, "dst": dst, "lanes": td.link_lanes[i], "words": t.words, "window": t.window,
                      "latency": l.latency, "bw": f"{bw.numerator}/{bw.denominator}",
                      "params": list(t.link_params().items())})
    rings = []
    for src, dst, l, ln, words in td.rings:
        from bapipe.codegen.design.links import transport
        t = transport(l, ln, td.acc_w, words)
        bw = l.bytes_per_cycle
        rings.append({"src": src, "dst": dst, "lanes": ln, "words": t.words, "window": t.window,
                      "latency": l.latency, "bw": f"{bw.numerator}/{bw.denominator}",
                      "params": list(t.link_params().items())})
    p_ = td.stages
    chains = [{"head": q * p_, "tail": q * p_ + p_ - 1} for q in range(td.replicas)]
    files["train_cluster_top.v"] = render_template(
        "train_cluster_top", plan_hash, boards=ctxs, links=links, rings=rings, chains=chains, acc_w=td.acc_w,
        turns=[_turns_ctx(t) for t in td.turns],
        elem_w=td.elem_w,
        in_w=td.boards[0].in_elems * td.elem_w, out_w=td.boards[-1].out_elems * td.elem_w,
        dx_w=td.boards[0].in_elems * td.elem_w)
    return files


def _turns_ctx(t: dict) -> dict:
    """train_turns' parameters of a device: its ops' chunks as a ROM (CH_W bits an op, op 0 lowest)."""
    v, n = len(t["boards"]), len(t["order"])
    ch_w = clog2(v)
    rom = 0
    for k, c in enumerate(t["order"]):
        rom |= c << (k * ch_w)
    return {"device": t["device"], "v": v, "nops": n, "op_w": clog2(n), "ch_w": ch_w,
            "order": f"{n * ch_w}'h{rom:0{(n * ch_w + 3) // 4}x}"}


def design_record(td: TrainDesign, plan) -> dict:
    """The ``train`` section of build/design.json: per board its engines, op order, stashes and
    cycles per op (design and plan), links."""
    return {
        "schedule": td.schedule, "microbatches": td.microbatches, "clock_hz": td.clock_hz,
        "optimizer": {"kind": "sgd", "learning_rate": LEARNING_RATE, "momentum": MOMENTUM, "mu_q": td.consts.mu,
                      "lr_q": [c.lr for c in td.sgd.steps], "lr_period": td.sgd.period,
                      "lr_shift": td.consts.shift, "master_bits": td.tf.master.width,
                      "velocity_bits": td.tf.vel.width},
        "plan_iteration_cycles": td.plan_cycles,
        "boards": [{
            "index": b.index, "board": b.name, "module": b.module, "stashes": b.stashes,
            "ops": [f"{k}{mb}" for k, mb in b.ops],
            "samples_per_microbatch": b.beta, "fwd_cycles": b.op_fwd_cycles, "bwd_cycles": b.op_bwd_cycles,
            "update_cycles": b.update_cycles, "rank": b.rank, "replicas": b.replicas, "device": b.device,
            "chunk": b.chunk,
            "plan_fwd_cycles": b.plan_fwd_cycles, "plan_bwd_cycles": b.plan_bwd_cycles,
            "nodes": [{"layer": l.name, "kind": l.kind, "pe": l.pe, "simd": l.simd, "lanes": l.lanes,
                       "fwd_cycles": l.fwd_cycles, "bwd_in_cycles": l.bwd_in_cycles, "bwd_w_cycles": l.bwd_w_cycles,
                       "update_cycles": l.update_cycles} for l in b.layers],
            "steps": [{"phase": ph, "engine": inst, "cycles": c} for ph, inst, c in b.steps()],
        } for b in td.boards],
        "rings": [_ring_record(td, src, l, ln, words) for src, _dst, l, ln, words in td.rings],
        "turns": [{"device": t["device"], "boards": t["boards"], "order": t["order"]} for t in td.turns],
        "links": [{"src": l.src, "dst": l.dst, "lanes": ln, "bytes_per_cycle": float(l.bytes_per_cycle),
                   "latency": l.latency, "words_per_beat": t.words, "beats_per_vector": t.sample_beats,
                   "window": t.window, "timeout": t.timeout, "cycles_per_vector": float(t.cycles_per_sample),
                   "delivery_latency": t.delivery_latency}
                  for l, ln, t in zip(td.links, td.link_lanes, td.transports)],
    }


def _ring_record(td: TrainDesign, src: int, l, lanes: int, words: int) -> dict:
    """One ring hop of the design record: the share it carries and its cycles per step
    (fpga_models.collective.ring_step_cycles, the one home of the ring's timing)."""
    from bapipe.fpga_models.collective import ring_allreduce_cycles, ring_step_cycles
    b = td.boards[src]
    _ln, occ, deliver = ring_step_cycles(b.ring["n"], b.replicas, td.elem_w, l.bytes_per_cycle, l.latency)
    return {"src": l.src, "dst": l.dst, "sums": b.ring["n"], "share": b.ring["share"], "lanes": lanes,
            "words": words, "step_cycles": occ, "delivery_cycles": deliver,
            "allreduce_cycles": ring_allreduce_cycles(b.ring["n"], b.replicas, td.elem_w, l.bytes_per_cycle,
                                                      l.latency)}



# ------------------------------------------------------------------ build files

def train_manifest(td: TrainDesign, plan, files: list[str]) -> dict:
    """rtl/train/manifest.json: what `bapipe rtlsim` needs to run and check the training build."""
    dense = [{"name": l.name, "ident": l.ident, "mh": l.mh, "mw": l.mw, "pe": l.pe, "simd": l.simd,
              **({"conv": [l.mh, l.geom["c"], l.geom["k"], l.geom["k"]]} if l.kind == "conv2d" else {}),
              **({"bn": True} if l.kind == "batchnorm" else {}), **({"bias": False} if not l.bias else {})}
             for b in td.boards if b.rank == 0 for l in b.layers if l.kind in TRAINED_KINDS]
    return {
        "training": True, "plan": plan.fingerprint(), "model": plan.model, "number_format": td.fmt,
        "microbatch_size": td.boards[0].beta * td.replicas, "replicas": td.replicas,
        "replica_sfx": [_name_sfx(b) for b in td.boards[::td.stages]],
        "elem_w": td.elem_w, "frac": td.frac, "schedule": td.schedule, "microbatches": td.microbatches,
        "boards": [b.name for b in td.boards], "in_elems": td.boards[0].in_elems,
        "out_elems": td.boards[-1].out_elems, "layers": [l.name for b in td.boards if b.rank == 0 for l in b.layers],
        "dense": dense, "clock_hz": td.clock_hz, "master_w": td.tf.master.width,
        "sgd": {"mu": td.consts.mu, "lr": td.consts.lr, "lr_scale": td.consts.lr_scale, "shift": td.consts.shift,
                "lr_steps": [c.lr for c in td.sgd.steps], "lr_period": td.sgd.period,
                "learning_rate": LEARNING_RATE, "momentum": MOMENTUM},
        "plan_iteration_cycles": td.plan_cycles,
        "update_cycles": [b.update_cycles for b in td.boards],
        "sequential_cycles": sum(td.microbatches * (b.op_fwd_cycles + b.op_bwd_cycles) + b.update_cycles
                                 for b in td.boards),
        "files": files,
    }


def write_train_files(td: TrainDesign, plan, rtl) -> tuple[list, dict]:
    """Write ``rtl/train/`` for the Design's training lowering ``td``: (paths, the design.json
    ``train`` record)."""
    import json
    from pathlib import Path

    files = render_train(td, plan.fingerprint()[:16])
    d = Path(rtl) / "train"
    d.mkdir(parents=True, exist_ok=True)
    names = sorted(files, key=lambda n: (n == "train_cluster_top.v", n))
    files["manifest.json"] = json.dumps(train_manifest(td, plan, names), indent=1, sort_keys=True) + "\n"
    paths = []
    for n in sorted(files):
        (d / n).write_text(files[n], encoding="utf-8")
        paths.append(d / n)
    return paths, design_record(td, plan)


def train_reference_from_manifest(man: dict, rtl_dir, x_q, labels, iterations: int):
    """:func:`train_reference` for a build's training manifest, from its weight images."""
    from pathlib import Path

    from bapipe.models import load_model

    model = load_model(man["model"])
    if [l.name for l in model.layers] != man["layers"]:
        raise Unsupported("the training build does not hold the whole model (its reference is train_step)")
    params = {}
    sfx0 = man.get("replica_sfx", [""])[0]     # replicas start equal: replica 0's images
    for l in man["dense"]:
        flat = read_hex((Path(rtl_dir) / f"{l['ident']}{sfx0}_w.hex").read_text(), man["elem_w"])
        if l.get("bn"):                          # batchnorm: scale and shift
            params[l["name"]] = {"scale": flat, "shift": read_hex((Path(rtl_dir) / f"{l['ident']}{sfx0}_b.hex")
                                                             .read_text(), man["elem_w"])}
            continue
        w = from_tile_order(flat, l["mh"], l["mw"], l["pe"], l["simd"])
        if "conv" in l:                          # (O, K*K*C) -> (O, C, K, K)
            o, c, kh, kw = l["conv"]
            w = w.reshape(o, kh, kw, c).transpose(0, 3, 1, 2)
        params[l["name"]] = {"w": w}
        if l.get("bias", True):                  # bias: false: the model's layer has none (the engines' stays 0)
            params[l["name"]]["b"] = read_hex((Path(rtl_dir) / f"{l['ident']}{sfx0}_b.hex").read_text(), man["elem_w"])
    c = man["sgd"]
    consts = tfx.SgdSchedule(tuple(tfx.SgdConstants(mu=c["mu"], lr=q, lr_scale=c["lr_scale"], shift=c["shift"])
                                   for q in c.get("lr_steps", [c["lr"]])), c.get("lr_period", 1))
    snaps, outs, dys = train_reference(model, params, man["microbatches"], man["number_format"], consts, x_q, labels,
                                       iterations, man.get("microbatch_size", 1))
    # the engines' weight memories hold MH x MW matrices: compare conv weights in that form
    snaps = [{n: ({"w": weight_matrix(p["w"]), "b": p["b"] if "b" in p else np.zeros(len(p["w"]), dtype=np.int64)}
                  if "w" in p else {"w": p["scale"].reshape(-1, 1),
                                                                              "b": p["shift"]})
              for n, p in snap.items()} for snap in snaps]
    return snaps, outs, dys
