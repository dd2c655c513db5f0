"""C-simulation of training iterations on a mode: train build (`bapipe csim build/ --iterations K`).

Per iteration, on one random batch (the plan's micro-batches x micro-batch size, random
labels); a stage with R replicas runs every kernel once per replica, each on its MB = size / R
samples of every micro-batch, with its own memories:

1. every stage's forward kernel (stage<i>) streams its inputs, reading its weights from the
   writable m_axi arrays (roms.bin layout) the update kernel wrote last, and writes the
   activations its backward kernel needs to its stash memories (codegen.design.stash): one call per
   micro-batch, in the order of the plan's schedule (bapipe.schedules.device_ops: 1F1B
   interleaves forwards and backwards; an interleaved device's chunk its own ops), micro-batch j
   into slot j mod S, S = bapipe.schedules.chunk_stash_count (the plan's ``stashes``); each backward reads the slot as it stands at its turn in that
   order (so too few slots hand it a later micro-batch's activations). A stage whose forward
   writes no stashes (host_config ``stash_note`` says why) runs its forward once for the whole
   batch and its backward's stashes are replayed by the host (``not_in_hls`` says so);
2. the loss gradient of the logits: the loss kernel (stage<last>_loss, codegen.design.train_kernels) on
   the whole batch, checked against fpga_models.train_fixed.softmax_xent_grad (on the host
   when the build has none: a last stage that does not put out one vector of logits);
3. every stage's backward kernel (stage<i>_bwd), last stage first: one call per micro-batch
   (reading that micro-batch's stash slot), then the flush that writes the exact
   weight-gradient sums (its accumulators live in one C-simulation per iteration, so the
   interleaving is applied to the stash memories, which the forward and backward share);
4. a replicated stage's all-reduce kernel (stage<i>_allreduce): its R replicas run at once in
   one C-simulation, connected in a ring, and each ends with the total of every replica's sums;
5. every stage's update kernel (stage<i>_update): SGD with momentum on the master weights and
   velocities, writing the 16-bit weights both kernels read next.

The reference is fpga_models.train_fixed.train_step on the same batch from the same initial
weights; after every iteration the kernels' master weights, velocities and gradient sums are
compared with it bit for bit (``weights_match``: every replica's), as are the stages' forward
outputs and the weight-gradient sums each replica's update kernel reads.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from bapipe.errors import SpecError
from bapipe.fpga_models import fixedpoint as fx
from bapipe.fpga_models import train_fixed as tfx

#: SGD constants of the csim run (docs/training.md: digits/tiny-mlp's lr 0.05, momentum 0.9)
LR = 0.05
MOMENTUM = 0.9


def _kernel_layout(a: np.ndarray) -> np.ndarray:
    return (fx.conv_weight_matrix(a) if np.ndim(a) == 4 else np.asarray(a)).reshape(-1)




def _words(a: np.ndarray, wide: bool) -> np.ndarray:
    """int32 words of raw values: int64 as (lo, hi) pairs when ``wide``."""
    a = np.asarray(a, dtype=np.int64).reshape(-1)
    if not wide:
        return a.astype("<i4")
    return np.stack([a & 0xFFFFFFFF, a >> 32], axis=1).reshape(-1).astype(np.uint32).view("<i4")


def _unwords(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w, dtype=np.int64)
    return (w[1::2] << 32) | (w[0::2] & 0xFFFFFFFF)


def _check_build(cfg: dict, build: Path) -> None:
    if cfg.get("mode") != "train":
        raise SpecError(str(build / "host_config.json"), None, "mode",
                        "expected a build of a mode: train plan for --iterations (this one is inference)")
    for st in cfg["stages"]:
        u = st.get("update") or {}
        if st.get("backward") is None or (st["backward"]["weight_grads"] and not u.get("kernel")):
            why = u.get("not_generated") or "no backward kernel"
            raise SpecError(str(build / "host_config.json"), None, f"stages[{st['index']}].update",
                            f"expected an update kernel for --iterations; {why}")


class _Replica:
    """One replica's kernel-side state: its weight image (weights.bin, codegen.design.weight_image:
    the forward kernel's arrays, which the backward kernel's testbench unfolds into its own
    layout and the update kernel rewrites), and the master weights and velocities the update
    kernel keeps (kernel layout)."""

    def __init__(self, build: Path, st: dict, fmt: fx.Fmt, work: Path):
        from bapipe.codegen.check.cxx_run import load_weights

        self.cfg = st
        work.mkdir(parents=True, exist_ok=True)
        self.image = work / "weights.bin"
        self.image.write_bytes((build / st["weights_file"]).read_bytes())
        self.dtype = np.dtype(st["weights_dtype"])
        init = load_weights(build, st, fmt)     # the 16-bit weights gen wrote: the initial master weights
        shift = tfx.get_formats(fmt.name).master.frac - fmt.frac
        self.arrays = st["update"]["arrays"] if st.get("update") else []   # a stage without weights: none
        self.master = {a["name"]: _kernel_layout(init[a["layer"]][a["kind"]]).astype(np.int64) << shift
                       for a in self.arrays}
        self.vel = {a["name"]: np.zeros_like(self.master[a["name"]]) for a in self.arrays}

    def weights(self, fmt: fx.Fmt) -> dict:
        """The 16-bit weights the kernels read now (model layout, per layer), from the image."""
        from bapipe.codegen.design.weight_image import read_layers

        return read_layers(self.image.parent, [dict(w, file=self.image.name) for w in self.cfg["weights"]])


class _Stage:
    """One stage's compiled kernels (forward, backward, update; all-reduce when replicated) and
    its replicas."""

    def __init__(self, build: Path, st: dict, model, fmt: fx.Fmt, cache: Path, work: Path, replicas: int):
        from bapipe.codegen.check.cxx_run import build_flags, compile_sources, stage_macs

        self.cfg, self.name = st, st["kernel"]
        self.layers = [model.layers[model.index[l["name"]]] for l in st["layers"]]
        self.mb = st["backward"]["microbatch"]
        sdir = build / self.name
        inc = [sdir, build / "common"]
        fwd_macs, bwd_macs = stage_macs(self.layers)
        self.compile_s, self.cached = 0.0, True
        self.bins = {}
        tops = [("fwd", self.name, fwd_macs), ("bwd", st["backward"]["kernel"], bwd_macs)]
        if st.get("update"):
            tops.append(("update", st["update"]["kernel"], 0))
        if replicas > 1 and st.get("update"):
            tops.append(("allreduce", st["update"]["allreduce"]["kernel"], 0))
        for what, top, macs in tops:
            c = compile_sources([sdir / f"{top}.cpp", sdir / f"tb_{top}.cpp"], inc, cache, top,
                                build_flags(macs * self.mb))
            self.bins[what] = c.path
            self.compile_s += c.compile_s
            self.cached = self.cached and c.cached
        self.reps = [_Replica(build, st, fmt, work / self.name / f"r{k}") for k in range(replicas)]
        self.stash_bufs = st.get("stashes") or []   # codegen.design.stash: what the forward kernel writes
        self.slots = self.stash_bufs[0]["slots"] if self.stash_bufs else 0


def _run(cmd: list, td: Path) -> tuple[np.ndarray, dict]:
    from bapipe.codegen.check.cxx_run import _check_streams, _run as run_csim, read_stats

    r = run_csim([str(c) for c in cmd], td / "stats.json")
    if r.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} exited {r.returncode}: {r.stderr[-2000:]}")
    _check_streams(Path(cmd[0]).name, r.stdout)
    return np.fromfile(cmd[2], dtype="<i4").astype(np.int64), read_stats(td / "stats.json")


def _forward(s: _Stage, rep: _Replica, xs: list[np.ndarray], n: int, td: Path) -> tuple[list[np.ndarray], int]:
    from bapipe.codegen.check.cxx_run import from_stream, to_stream

    fin, fout = td / "fwd_in.bin", td / "fwd_out.bin"
    fin.write_bytes(b"".join(p.tobytes() for p in [np.array([n], "<i4")] + [to_stream(x).astype("<i4") for x in xs]))
    cmd = [s.bins["fwd"], fin, fout] + ([] if s.cfg["embedded_weights"] else [rep.image])
    vals, stats = _run(cmd, td)
    outs, pos = [], 0
    for p in s.cfg["outputs"]:
        outs.append(from_stream(vals[pos:pos + n * p["elements"]].reshape(n, p["elements"]), tuple(p["shape"])))
        pos += n * p["elements"]
    stash = {}
    for b in s.stash_bufs:   # what the kernel wrote to its stash memories (raw, the backward's order)
        stash[b["tensor"]] = vals[pos:pos + n * b["elements"]].reshape(n, b["elements"])
        pos += n * b["elements"]
    return outs, stats.get("cycles") or 0, stash


def _backward(s: _Stage, rep: _Replica, stashes: list[np.ndarray], dys: list[np.ndarray], n: int, td: Path):
    from bapipe.codegen.check.cxx_run import from_stream, to_stream
    from bapipe.codegen.check.csim_bwd import weight_sums

    b = s.cfg["backward"]
    fin, fout = td / "bwd_in.bin", td / "bwd_out.bin"
    parts = [np.array([n], "<i4")] + [np.asarray(x).astype("<i4") for x in stashes] \
        + [to_stream(x).astype("<i4") for x in dys]
    fin.write_bytes(b"".join(p.tobytes() for p in parts))
    vals, stats = _run([s.bins["bwd"], fin, fout, rep.image], td)
    outs, pos = [], 0
    for p in b["outputs"]:
        outs.append(from_stream(vals[pos:pos + n * p["elements"]].reshape(n, p["elements"]), tuple(p["shape"])))
        pos += n * p["elements"]
    sums = dict(zip((a["name"] for a in b["weight_grads"]), weight_sums(vals[pos:-4], b["weight_grads"])))
    return outs, sums, stats.get("cycles") or 0


def _allreduce(s: _Stage, sums: list[dict], td: Path) -> tuple[list[dict], int]:
    """Every replica's sums through the all-reduce kernel (its replicas run at once in one
    C-simulation, connected in a ring); returns each replica's sums after it."""
    grads = s.cfg["update"]["allreduce"]["arrays"]
    fin, fout = td / "ar_in.bin", td / "ar_out.bin"
    fin.write_bytes(b"".join(_words(r[g["name"]], True).tobytes() for r in sums for g in grads))
    vals, stats = _run([s.bins["allreduce"], fin, fout], td)
    out, pos = [], 0
    for _ in sums:
        d = {}
        for g in grads:
            d[g["name"]] = _unwords(vals[pos:pos + 2 * g["elements"]])
            pos += 2 * g["elements"]
        out.append(d)
    return out, int(stats.get("cycles") or 0)


def _update(s: _Stage, rep: _Replica, sums: dict, c: tfx.SgdConstants, fmt: fx.Fmt, td: Path) -> int:
    fin, fout, fw, fr = td / "upd_in.bin", td / "upd_out.bin", td / "upd_w.bin", td / "upd_roms.bin"
    parts = [np.array([c.mu, c.lr, c.shift], "<i4")]
    for a in rep.arrays:
        parts += [_words(sums[a["grad"]], True), _words(rep.master[a["name"]], False), _words(rep.vel[a["name"]], True)]
    fin.write_bytes(b"".join(p.tobytes() for p in parts))
    vals, stats = _run([s.bins["update"], fin, fout, fw, fr], td)
    pos = 0
    for a in rep.arrays:
        k = a["elements"]
        rep.master[a["name"]] = vals[pos:pos + k]
        rep.vel[a["name"]] = _unwords(vals[pos + k:pos + 3 * k])
        pos += 3 * k
    _rewrite_image(s.cfg, rep, np.fromfile(fw, dtype=rep.dtype), np.fromfile(fr, dtype=rep.dtype))
    return int(stats.get("cycles") or 0)


def _rewrite_image(st: dict, rep: _Replica, w16: np.ndarray, roms: np.ndarray) -> None:
    """The replica's weight image after an update: the forward engine kernel's arrays as the
    update kernel wrote them (``roms``, in argument order), or, for a per-layer kernel, its
    16-bit copy in kernel layout (``w16``, the update arrays in order), which is the image's
    layout there. The 16-bit copy the backward kernel reads on a board must hold what the image
    holds: checked array by array (the backward's testbench reads the image)."""
    from bapipe.codegen.design.weight_image import kernel_layout

    img = np.fromfile(rep.image, dtype=rep.dtype)
    entries = {w["name"]: w for w in st["weights"]}
    pos = 0
    for r in st["roms"]:
        img[r["offset"]:r["offset"] + r["elements"]] = roms[pos:pos + r["elements"]]
        pos += r["elements"]
    pos = 0
    for a in rep.arrays:
        w, k = entries[a["name"]], w16[pos:pos + a["elements"]]
        pos += a["elements"]
        if not st["roms"]:
            img[w["offset"]:w["offset"] + w["elements"]] = k
            continue
        held = kernel_layout(img[w["offset"]:w["offset"] + w["elements"]].astype(np.int64), w).reshape(-1)
        if not np.array_equal(held, k.astype(np.int64)):
            raise RuntimeError(f"{st['update']['kernel']}: the 16-bit copy of {a['name']} differs from the forward "
                               f"kernel's array it rewrote ({int(np.sum(held != k))} elements)")
    img.tofile(rep.image)


def _loss(binary: Path, logits: np.ndarray, labels: np.ndarray, td: Path) -> tuple[np.ndarray, int]:
    """The loss kernel's dz for a batch of logits (N, classes) and labels."""
    fin, fout = td / "loss_in.bin", td / "loss_out.bin"
    n = len(labels)
    fin.write_bytes(b"".join(a.astype("<i4").tobytes() for a in (np.array([n]), logits.reshape(-1), np.asarray(labels))))
    vals, stats = _run([binary, fin, fout], td)
    return vals[:logits.size].reshape(logits.shape), int(stats.get("cycles") or 0)


def _shard(m: int, size: int, beta: int, k: int) -> np.ndarray:
    """Sample indices replica k computes: its beta samples of each of the m micro-batches."""
    return np.concatenate([np.arange(j * size + k * beta, j * size + (k + 1) * beta) for j in range(m)])


def _ops(plan, index: int, m: int) -> list:
    """Plan stage ``index``'s forward and backward ops of one iteration in its device's order (an
    interleaved device's chunk: that chunk's ops, as the training RTL's chunk board runs them)."""
    from bapipe.schedules import chunk_ops

    st = plan.stages[index]
    return [o for o in chunk_ops(plan.schedule, plan.devices, st.device, m, plan.chunks, st.chunk)
            if o.kind in ("F", "B")]


def _forward_pass(stages: list, x: np.ndarray, in_name: str, m: int, size: int, fmt: fx.Fmt, td: Path,
                  plan):
    """Every stage's forward kernel, each replica on its share of every micro-batch, checked
    against the fixed-point forward with the weights it read. A stage whose forward kernel
    writes stashes runs one call per micro-batch in the schedule's op order: the forward of
    micro-batch j writes stash slot j mod S, and the backward of j will read what the slot
    holds at its turn in that order (a slot count below the schedule's peak hands it a later
    micro-batch's stash). Returns (every tensor between stages, each stage's inputs, max error
    in LSB, cycles per stage, per stage and replica the stashes each backward call reads)."""
    n = len(x)
    tensors, ins_of, err = {in_name: x}, {}, 0
    cyc = {s.name: {"forward": 0, "backward": 0, "update": 0} for s in stages}
    reads: dict = {}
    for d, s in enumerate(stages):
        xs = [tensors[p["tensor"]] for p in s.cfg["inputs"]]
        ins_of[s.name] = xs
        full = [np.zeros((n,) + tuple(p["shape"]), dtype=np.int64) for p in s.cfg["outputs"]]
        reads[s.name] = []
        for k, rep in enumerate(s.reps):
            if s.stash_bufs:   # one call per micro-batch, in the schedule's op order
                slots: dict = {}
                got: dict = {}
                f_cyc = 0
                for op in _ops(plan, s.cfg["index"], m):
                    if op.kind == "B":
                        got[op.mb] = slots[op.mb % s.slots]
                        continue
                    idx = np.arange(op.mb * size + k * s.mb, op.mb * size + (k + 1) * s.mb)
                    outs, c, stash = _forward(s, rep, [v[idx] for v in xs], len(idx), td)
                    slots[op.mb % s.slots] = stash
                    f_cyc += c
                    err = max(err, _fwd_err(s, rep, xs, idx, outs, full, fmt))
                reads[s.name].append([got[j] for j in range(m)])
                cyc[s.name]["forward"] = max(cyc[s.name]["forward"], f_cyc)
            else:
                idx = _shard(m, size, s.mb, k)
                outs, c, _ = _forward(s, rep, [v[idx] for v in xs], len(idx), td)
                cyc[s.name]["forward"] = max(cyc[s.name]["forward"], c)
                err = max(err, _fwd_err(s, rep, xs, idx, outs, full, fmt))
        tensors.update({p["tensor"]: f for p, f in zip(s.cfg["outputs"], full)})
    return tensors, ins_of, err, cyc, reads


def _fwd_err(s, rep, xs, idx, outs, full, fmt) -> int:
    """Max difference of a forward call's outputs from the fixed-point forward (and keep them)."""
    ref = fx.model_fwd(s.layers, {p["tensor"]: v[idx] for p, v in zip(s.cfg["inputs"], xs)}, rep.weights(fmt), fmt)
    err = 0
    for p, o, f in zip(s.cfg["outputs"], outs, full):
        err = max(err, int(np.max(np.abs(o - ref[p["tensor"]]))))
        f[idx] = o
    return err


def _backward_pass(stages: list, grads: dict, ins_of: dict, m: int, size: int, n: int, fmt: fx.Fmt, td: Path,
                   cyc: dict, reads: dict) -> tuple[dict, int]:
    """Every stage's backward kernel, last stage first, each replica on its share, reading the
    stashes its forward kernel wrote (``reads``; a time-multiplexed stage's are replayed by the
    host: codegen.design.stash), then a replicated stage's all-reduce. Returns each stage's
    per-replica weight-gradient sums as its update kernels will read them, and the largest
    difference (LSB) of a stash read from the fixed-point forward's activation."""
    from bapipe.codegen.check.cxx_run import to_stream

    sums_of, st_err = {}, 0
    for s in reversed(stages):
        b = s.cfg["backward"]
        full = [np.zeros((n,) + tuple(p["shape"]), dtype=np.int64) for p in b["outputs"]]
        sums_of[s.name] = []
        for k, rep in enumerate(s.reps):
            idx = _shard(m, size, s.mb, k)
            acts = fx.model_fwd(s.layers, {p["tensor"]: v[idx] for p, v in zip(s.cfg["inputs"], ins_of[s.name])},
                                rep.weights(fmt), fmt)
            want = [to_stream(acts[a["tensor"]]) for a in b["stashes"]]
            if s.stash_bufs:
                got = reads[s.name][k]
                stashes = [np.concatenate([got[j][a["tensor"]] for j in range(m)]) for a in b["stashes"]]
                st_err = max([st_err] + [int(np.max(np.abs(g - w))) for g, w in zip(stashes, want)])
            else:
                stashes = want
            dys = [grads[p["tensor"]][idx] for p in b["inputs"]]
            outs, sums, c = _backward(s, rep, stashes, dys, len(idx), td)
            cyc[s.name]["backward"] = max(cyc[s.name]["backward"], c)
            sums_of[s.name].append(sums)
            for o, f in zip(outs, full):
                f[idx] = o
        grads.update({p["tensor"]: f for p, f in zip(b["outputs"], full)})
        if len(s.reps) > 1 and "allreduce" in s.bins:
            sums_of[s.name], cyc[s.name]["allreduce"] = _allreduce(s, sums_of[s.name], td)
    return sums_of, st_err


def _update_pass(stages: list, sums_of: dict, ref_grads: dict, consts: tfx.SgdConstants, fmt: fx.Fmt, td: Path,
                 cyc: dict) -> int:
    """Every replica's update kernel on its sums; returns the sums' max difference from the
    reference's exact batch gradients."""
    err = 0
    for s in stages:
        for k, rep in enumerate(s.reps):
            for a in s.cfg["backward"]["weight_grads"]:
                ref = _kernel_layout(ref_grads[a["layer"]][{"dw": "w", "db": "b"}.get(a["kind"], a["kind"])])
                err = max(err, int(np.max(np.abs(sums_of[s.name][k][a["name"]] - ref))))
            if "update" in s.bins:
                cyc[s.name]["update"] = max(cyc[s.name]["update"], _update(s, rep, sums_of[s.name][k], consts, fmt, td))
    return err


def _compare_weights(stages: list, new_m: dict, new_v: dict, before: dict) -> dict:
    """Every replica's master weights and velocities against the reference's."""
    w_err = v_err = 0
    for s in stages:
        for rep in s.reps:
            for a in rep.arrays:
                w_err = max(w_err, int(np.max(np.abs(rep.master[a["name"]] - _kernel_layout(new_m[a["layer"]][a["kind"]])))))
                v_err = max(v_err, int(np.max(np.abs(rep.vel[a["name"]] - _kernel_layout(new_v[a["layer"]][a["kind"]])))))
    moved = sum(int(np.sum(rep.master[key] != before[(s.name, k, key)]))
                for s in stages for k, rep in enumerate(s.reps) for key in rep.master)
    return {"master_moved": moved, "master_elements": sum(v.size for v in before.values()),
            "master_max_abs_err_lsb": w_err, "velocity_max_abs_err_lsb": v_err,
            "weights_match": w_err == 0 and v_err == 0}


def _compile_loss(cfg: dict, build: Path, cache: Path) -> Path | None:
    """The loss kernel's testbench binary, when the build has one."""
    from bapipe.codegen.check.cxx_run import compile_sources

    lk = cfg.get("loss")
    if not lk:
        return None
    ldir = build / lk["stage"]
    return compile_sources([ldir / f"{lk['kernel']}.cpp", ldir / f"tb_{lk['kernel']}.cpp"], [ldir, build / "common"],
                           cache, lk["kernel"]).path


def csim_train(build: str | Path, iterations: int, seed: int = 0, lr: float = LR, momentum: float = MOMENTUM,
               cache: Path | None = None, stash_slots: int | None = None) -> dict:
    """Run ``iterations`` training iterations of a training build in C-simulation (module
    docstring) and compare with fpga_models.train_fixed.train_step after every one."""
    import json

    from bapipe.plan import load_plan
    from bapipe.models import load_model

    from bapipe.codegen.check.cxx_run import cache_dir, random_input

    build = Path(build)
    cfg = json.loads((build / "host_config.json").read_text())
    _check_build(cfg, build)
    plan = load_plan(build / "plan.yaml")
    model = load_model(plan.model)
    fmt = fx.get_fmt(cfg["format"]["name"])
    tf = tfx.get_formats(fmt.name)
    cache = cache or cache_dir(build)
    stages_cfg = cfg["stages"]
    m, size = max(1, plan.microbatches), max(1, plan.microbatch_size)
    reps = {st.index: max(1, st.replicas) for st in plan.stages}
    for st in stages_cfg:
        r = reps.get(st["index"], 1)
        if size % r or st["backward"]["microbatch"] != size // r:
            raise SpecError(str(build / "plan.yaml"), None, f"stages[{st['index']}].replicas",
                            f"expected the micro-batch of {size} samples to split evenly over {r} replicas "
                            f"(the backward kernel takes {st['backward']['microbatch']})")
    n = m * size
    try:
        consts = tfx.sgd_constants(lr, momentum, n, tf)
    except ValueError as e:   # e.g. lr / batch beyond what the fixed-point update can shift
        raise SpecError(None, None, "--lr", str(e)) from None
    rng = np.random.default_rng(seed)
    in_shape = tuple(stages_cfg[0]["inputs"][0]["shape"])
    out_t = stages_cfg[-1]["outputs"][0]["tensor"]
    classes = stages_cfg[-1]["outputs"][0]["elements"]
    rows, t_all = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bapipe-csim-train-") as tdir:
        td = Path(tdir)
        t0 = time.perf_counter()
        stages = [_Stage(build, st, model, fmt, cache, td, reps.get(st["index"], 1)) for st in stages_cfg]
        loss_bin = _compile_loss(cfg, build, cache)
        for s in stages:   # tests only: fewer slots than the schedule needs must break the bits
            if stash_slots is not None and s.stash_bufs:
                s.slots = stash_slots
        compile_s = time.perf_counter() - t0
        ref_master = {layer: {k: np.asarray(a, np.int64) << (tf.master.frac - fmt.frac) for k, a in d.items()}
                      for s in stages for layer, d in s.reps[0].weights(fmt).items()}
        ref_vel: dict = {}
        for it in range(iterations):
            x = random_input(rng, n, in_shape, fmt)
            labels = rng.integers(0, classes, size=n)
            new_m, new_v, info = tfx.train_step(model, ref_master, ref_vel, x, labels, consts, tf, microbatches=m)
            row = {"iteration": it, "samples": n, "microbatches": m, "loss": round(float(info["loss"]), 6)}
            tensors, ins_of, fwd_err, cyc, reads = _forward_pass(stages, x, model.inputs[0].name, m, size, fmt, td,
                                                                 plan)
            logits = tensors[out_t]
            row["logits_max_abs_err_lsb"] = int(np.max(np.abs(logits - info["logits"])))
            dz = dz_ref = tfx.softmax_xent_grad(logits, labels, tf)   # the host's, when there is no loss kernel
            if loss_bin is not None:
                dz, row["loss_cycles"] = _loss(loss_bin, logits, labels, td)
                row["loss_grad_max_abs_err_lsb"] = int(np.max(np.abs(dz - dz_ref)))
            sums_of, stash_err = _backward_pass(stages, {out_t: dz}, ins_of, m, size, n, fmt, td, cyc, reads)
            row["stash_max_abs_err_lsb"] = stash_err
            row["stash_slots"] = {s.name: s.slots for s in stages if s.stash_bufs}
            row["op_order"] = {s.name: " ".join(f"{o.kind}{o.mb}" for o in _ops(plan, s.cfg["index"], m))
                               for s in stages}
            before = {(s.name, k, key): v.copy() for s in stages for k, rep in enumerate(s.reps)
                      for key, v in rep.master.items()}
            grad_err = _update_pass(stages, sums_of, info["grads"], consts, fmt, td, cyc)
            row.update({"forward_max_abs_err_lsb": fwd_err, "grad_sums_max_abs_err": grad_err,
                        **_compare_weights(stages, new_m, new_v, before),
                        "replicas": {s.name: len(s.reps) for s in stages}, "cycles": cyc})
            rows.append(row)
            ref_master, ref_vel = new_m, new_v
    ok = bool(rows) and all(r["weights_match"] and r["forward_max_abs_err_lsb"] == 0 and r["grad_sums_max_abs_err"] == 0
                            and r["stash_max_abs_err_lsb"] == 0
                            and r["logits_max_abs_err_lsb"] == 0 and r.get("loss_grad_max_abs_err_lsb", 0) == 0
                            for r in rows)
    return {"mode": "train", "iterations": iterations, "weights_match": bool(rows) and all(r["weights_match"] for r in rows),
            "passed": ok, "per_iteration": rows, "format": fmt.name, "lr": lr, "momentum": momentum,
            "sgd_constants": {"mu": consts.mu, "lr": consts.lr, "shift": consts.shift},
            "compile_s": round(compile_s, 3), "cached": all(s.cached for s in stages),
            "run_s": round(time.perf_counter() - t_all, 3), "cache": str(cache),
            "not_in_hls": ([] if cfg.get("loss") else ["loss gradient (host: train_fixed.softmax_xent_grad)"])
            + [f"stashes of {st['kernel']} (host replay of the fixed-point forward): {st['stash_note']}"
               for st in stages_cfg if st.get("stash_note")], "schedule": plan.schedule}
