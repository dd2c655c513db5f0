"""C-simulation of training iterations on a mode: train build (`bapipe csim build/ --iterations K`).

Per iteration, on one random batch (the plan's micro-batches x the backward kernels' MB samples,
random labels), in the order a GPipe step runs:

1. every stage's forward kernel (stage<i>) streams the whole batch, reading its weights from
   the writable m_axi arrays (roms.bin layout) the update kernel wrote last;
2. the loss gradient of the logits (fpga_models.train_fixed.softmax_xent_grad) on the host:
   no HLS loss kernel exists yet;
3. every stage's backward kernel (stage<i>_bwd), last stage first: one call per micro-batch,
   then the flush that writes the exact weight-gradient sums; its stashes (each layer's
   forward input) are replayed from the host: the fixed-point forward of the stage's inputs
   with the weights the kernels read (the forward kernels do not write stashes yet);
4. every stage's update kernel (stage<i>_update): SGD with momentum on the master weights and
   velocities, writing the 16-bit weights both kernels read next.

The reference is fpga_models.train_fixed.train_step on the same batch from the same initial
weights; after every iteration the kernels' master weights, velocities and gradient sums are
compared with it bit for bit (``weights_match``), as are the stages' forward outputs and the
gradients leaving each backward kernel.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from bapipe.errors import SpecError
from fpga_models import fixedpoint as fx
from fpga_models import train_fixed as tfx

#: SGD constants of the csim run (docs/training.md: digits/tiny-mlp's lr 0.05, momentum 0.9)
LR = 0.05
MOMENTUM = 0.9


def _kernel_layout(a: np.ndarray) -> np.ndarray:
    return (fx.conv_weight_matrix(a) if np.ndim(a) == 4 else np.asarray(a)).reshape(-1)


def _model_layout(k: np.ndarray, shape: list[int]) -> np.ndarray:
    """Kernel layout (conv: MVU matrix [o][(ky*KW+kx)*C + c]) -> model layout (OIHW)."""
    if len(shape) == 4:
        o, c, kh, kw = shape
        return np.asarray(k).reshape(o, kh, kw, c).transpose(0, 3, 1, 2)
    return np.asarray(k).reshape(shape)


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
        if st.get("backward") is None or not u.get("kernel"):
            why = u.get("not_generated") or "no backward kernel"
            raise SpecError(str(build / "host_config.json"), None, f"stages[{st['index']}].update",
                            f"expected an update kernel for --iterations; {why}")


class _Stage:
    """One stage's three compiled kernels and its kernel-side state (files the kernels share)."""

    def __init__(self, build: Path, st: dict, model, fmt: fx.Fmt, cache: Path, work: Path):
        from .csim import build_flags, compile_sources, stage_macs

        self.cfg, self.name = st, st["kernel"]
        self.layers = [model.layers[model.index[l["name"]]] for l in st["layers"]]
        self.mb = st["backward"]["microbatch"]
        sdir = build / self.name
        inc = [sdir, build / "common"]
        fwd_macs, bwd_macs = stage_macs(self.layers)
        self.compile_s, self.cached = 0.0, True
        self.bins = {}
        for what, top, macs in (("fwd", self.name, fwd_macs), ("bwd", st["backward"]["kernel"], bwd_macs),
                                ("update", st["update"]["kernel"], 0)):
            c = compile_sources([sdir / f"{top}.cpp", sdir / f"tb_{top}.cpp"], inc, cache, top,
                                build_flags(macs * self.mb))
            self.bins[what] = c.path
            self.compile_s += c.compile_s
            self.cached = self.cached and c.cached
        self.dir = work / self.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.weights_file = self.dir / "weights.bin"
        self.weights_file.write_bytes((build / st["weights_file"]).read_bytes())
        self.roms_file = self.dir / "roms.bin"
        if st.get("roms_file"):
            self.roms_file.write_bytes((build / st["roms_file"]).read_bytes())
        from .csim import load_weights

        init = load_weights(build, st, fmt)     # the 16-bit weights gen wrote: the initial master weights
        shift = tfx.get_formats(fmt.name).master.frac - fmt.frac
        self.arrays = st["update"]["arrays"]
        self.master = {a["name"]: _kernel_layout(init[a["layer"]][a["kind"]]).astype(np.int64) << shift
                       for a in self.arrays}
        self.vel = {a["name"]: np.zeros_like(self.master[a["name"]]) for a in self.arrays}

    def weights(self, fmt: fx.Fmt) -> dict:
        """The 16-bit weights the kernels read now (model layout, per layer), from weights.bin."""
        dt = np.dtype("<i2") if fmt.width > 8 else np.dtype("i1")
        raw = np.fromfile(self.weights_file, dtype=dt).astype(np.int64)
        out: dict = {}
        for w in self.cfg["weights"]:
            out.setdefault(w["layer"], {})[w["name"].rsplit("_", 1)[1]] = \
                raw[w["offset"]:w["offset"] + w["elements"]].reshape(w["shape"])
        return out


def _run(cmd: list, td: Path) -> tuple[np.ndarray, dict]:
    from .csim import _check_streams, _run as run_csim, read_stats

    r = run_csim([str(c) for c in cmd], td / "stats.json")
    if r.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} exited {r.returncode}: {r.stderr[-2000:]}")
    _check_streams(Path(cmd[0]).name, r.stdout)
    return np.fromfile(cmd[2], dtype="<i4").astype(np.int64), read_stats(td / "stats.json")


def _forward(s: _Stage, xs: list[np.ndarray], n: int, td: Path) -> tuple[list[np.ndarray], int]:
    from .csim import from_stream, to_stream

    fin, fout = td / "fwd_in.bin", td / "fwd_out.bin"
    fin.write_bytes(b"".join(p.tobytes() for p in [np.array([n], "<i4")] + [to_stream(x).astype("<i4") for x in xs]))
    cmd = [s.bins["fwd"], fin, fout] + ([s.roms_file] if s.cfg.get("roms_file") else
                                        [] if s.cfg["embedded_weights"] else [s.weights_file])
    vals, stats = _run(cmd, td)
    outs, pos = [], 0
    for p in s.cfg["outputs"]:
        outs.append(from_stream(vals[pos:pos + n * p["elements"]].reshape(n, p["elements"]), tuple(p["shape"])))
        pos += n * p["elements"]
    return outs, stats.get("cycles") or 0


def _backward(s: _Stage, stashes: list[np.ndarray], dys: list[np.ndarray], n: int, td: Path):
    from .csim import from_stream, to_stream
    from .csim_bwd import weight_sums

    b = s.cfg["backward"]
    fin, fout = td / "bwd_in.bin", td / "bwd_out.bin"
    parts = [np.array([n], "<i4")] + [to_stream(x).astype("<i4") for x in stashes + dys]
    fin.write_bytes(b"".join(p.tobytes() for p in parts))
    vals, stats = _run([s.bins["bwd"], fin, fout, s.weights_file], td)
    outs, pos = [], 0
    for p in b["outputs"]:
        outs.append(from_stream(vals[pos:pos + n * p["elements"]].reshape(n, p["elements"]), tuple(p["shape"])))
        pos += n * p["elements"]
    sums = dict(zip((a["name"] for a in b["weight_grads"]), weight_sums(vals[pos:-4], b["weight_grads"])))
    return outs, sums, stats.get("cycles") or 0


def _update(s: _Stage, sums: dict, c: tfx.SgdConstants, fmt: fx.Fmt, td: Path) -> int:
    fin, fout, fw, fr = td / "upd_in.bin", td / "upd_out.bin", td / "upd_w.bin", td / "upd_roms.bin"
    parts = [np.array([c.mu, c.lr, c.shift], "<i4")]
    for a in s.arrays:
        parts += [_words(sums[a["grad"]], True), _words(s.master[a["name"]], False), _words(s.vel[a["name"]], True)]
    fin.write_bytes(b"".join(p.tobytes() for p in parts))
    vals, stats = _run([s.bins["update"], fin, fout, fw, fr], td)
    pos = 0
    for a in s.arrays:
        k = a["elements"]
        s.master[a["name"]] = vals[pos:pos + k]
        s.vel[a["name"]] = _unwords(vals[pos + k:pos + 3 * k])
        pos += 3 * k
    # the forward copy in the backward kernel's layout -> weights.bin (model layout, as gen writes it)
    dt = np.dtype("<i2") if fmt.width > 8 else np.dtype("i1")
    w16 = np.fromfile(fw, dtype=dt).astype(np.int64)
    shapes = {w["name"]: w for w in s.cfg["weights"]}
    out = np.zeros(sum(w["elements"] for w in s.cfg["weights"]), dtype=np.int64)
    pos = 0
    for a in s.arrays:
        w = shapes[a["name"]]
        out[w["offset"]:w["offset"] + w["elements"]] = _model_layout(w16[pos:pos + a["elements"]], w["shape"]).reshape(-1)
        pos += a["elements"]
    s.weights_file.write_bytes(out.astype(dt).tobytes())
    if s.cfg.get("roms_file"):
        s.roms_file.write_bytes(fr.read_bytes())   # the forward engine kernel's banked arrays, as written
    return int(stats.get("cycles") or 0)


def csim_train(build: str | Path, iterations: int, seed: int = 0, lr: float = LR, momentum: float = MOMENTUM,
               cache: Path | None = None) -> dict:
    """Run ``iterations`` training iterations of a training build in C-simulation (module
    docstring) and compare with fpga_models.train_fixed.train_step after every one."""
    import json

    from bapipe.plan import load_plan
    from bapipe.spec import load_model

    from .csim import cache_dir, random_input

    build = Path(build)
    cfg = json.loads((build / "host_config.json").read_text())
    _check_build(cfg, build)
    plan = load_plan(build / "plan.yaml")
    model = load_model(plan.model)
    fmt = fx.get_fmt(cfg["format"]["name"])
    tf = tfx.get_formats(fmt.name)
    if any(st.replicas > 1 for st in plan.stages):
        raise SpecError(str(build / "plan.yaml"), None, "stages.replicas",
                        "expected 1 replica per stage for csim --iterations (no HLS all-reduce kernel yet)")
    cache = cache or cache_dir(build)
    stages_cfg = cfg["stages"]
    mb = {st["backward"]["microbatch"] for st in stages_cfg}
    if len(mb) != 1:
        raise SpecError(str(build / "host_config.json"), None, "stages.backward.microbatch",
                        f"expected one micro-batch size for every stage, got {sorted(mb)}")
    mb = mb.pop()
    m = max(1, plan.microbatches)
    n = m * mb
    consts = tfx.sgd_constants(lr, momentum, n, tf)
    rng = np.random.default_rng(seed)
    in_name = model.inputs[0].name
    in_shape = tuple(stages_cfg[0]["inputs"][0]["shape"])
    out_t = stages_cfg[-1]["outputs"][0]["tensor"]
    classes = stages_cfg[-1]["outputs"][0]["elements"]
    rows, t_all = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bapipe-csim-train-") as tdir:
        td = Path(tdir)
        t0 = time.perf_counter()
        stages = [_Stage(build, st, model, fmt, cache, td) for st in stages_cfg]
        compile_s = time.perf_counter() - t0
        ref_master = {}
        for s in stages:
            for layer, d in s.weights(fmt).items():
                ref_master[layer] = {k: np.asarray(a, np.int64) << (tf.master.frac - fmt.frac) for k, a in d.items()}
        ref_vel: dict = {}
        for it in range(iterations):
            x = random_input(rng, n, in_shape, fmt)
            labels = rng.integers(0, classes, size=n)
            new_m, new_v, info = tfx.train_step(model, ref_master, ref_vel, x, labels, consts, tf, microbatches=m)
            row = {"iteration": it, "samples": n, "microbatches": m, "loss": round(float(info["loss"]), 6)}
            # forward through the stage kernels, each checked against the fixed-point forward
            tensors, ins_of, fwd_err, cyc = {in_name: x}, {}, 0, {}
            for s in stages:
                xs = [tensors[p["tensor"]] for p in s.cfg["inputs"]]
                ins_of[s.name] = xs
                outs, cyc[s.name] = _forward(s, xs, n, td)
                ref = fx.model_fwd(s.layers, {p["tensor"]: v for p, v in zip(s.cfg["inputs"], xs)}, s.weights(fmt), fmt)
                for p, o in zip(s.cfg["outputs"], outs):
                    fwd_err = max(fwd_err, int(np.max(np.abs(o - ref[p["tensor"]]))))
                    tensors[p["tensor"]] = o
            logits = tensors[out_t]
            row["logits_max_abs_err_lsb"] = int(np.max(np.abs(logits - info["logits"])))
            grads = {out_t: tfx.softmax_xent_grad(logits, labels, tf)}   # host: no HLS loss kernel
            # backward, last stage first; then every update kernel
            sums_of, bwd_cyc, upd_cyc = {}, {}, {}
            for s in reversed(stages):
                b = s.cfg["backward"]
                acts = fx.model_fwd(s.layers, {p["tensor"]: v for p, v in zip(s.cfg["inputs"], ins_of[s.name])},
                                    s.weights(fmt), fmt)   # the stash replay (module docstring, step 3)
                dys = [grads[p["tensor"]] for p in b["inputs"]]
                outs, sums_of[s.name], bwd_cyc[s.name] = _backward(s, [acts[a["tensor"]] for a in b["stashes"]], dys, n, td)
                for p, o in zip(b["outputs"], outs):
                    grads[p["tensor"]] = o
            before = {(s.name, k): v.copy() for s in stages for k, v in s.master.items()}
            grad_err = 0
            for s in stages:
                for a in s.cfg["backward"]["weight_grads"]:
                    ref = _kernel_layout(info["grads"][a["layer"]][{"dw": "w", "db": "b"}[a["kind"]]])
                    grad_err = max(grad_err, int(np.max(np.abs(sums_of[s.name][a["name"]] - ref))))
                upd_cyc[s.name] = _update(s, sums_of[s.name], consts, fmt, td)
            w_err = v_err = 0
            for s in stages:
                for a in s.arrays:
                    w_err = max(w_err, int(np.max(np.abs(s.master[a["name"]] - _kernel_layout(new_m[a["layer"]][a["kind"]])))))
                    v_err = max(v_err, int(np.max(np.abs(s.vel[a["name"]] - _kernel_layout(new_v[a["layer"]][a["kind"]])))))
            moved = sum(int(np.sum(s.master[k] != before[(s.name, k)])) for s in stages for k in s.master)
            row.update({"forward_max_abs_err_lsb": fwd_err, "grad_sums_max_abs_err": grad_err,
                        "master_moved": moved, "master_elements": sum(v.size for v in before.values()),
                        "master_max_abs_err_lsb": w_err, "velocity_max_abs_err_lsb": v_err,
                        "weights_match": w_err == 0 and v_err == 0,
                        "cycles": {k: {"forward": cyc[k], "backward": bwd_cyc[k], "update": upd_cyc[k]} for k in cyc}})
            rows.append(row)
            ref_master, ref_vel = new_m, new_v
    ok = bool(rows) and all(r["weights_match"] and r["forward_max_abs_err_lsb"] == 0 and r["grad_sums_max_abs_err"] == 0
                            and r["logits_max_abs_err_lsb"] == 0 for r in rows)
    return {"mode": "train", "iterations": iterations, "weights_match": bool(rows) and all(r["weights_match"] for r in rows),
            "passed": ok, "per_iteration": rows, "format": fmt.name, "lr": lr, "momentum": momentum,
            "sgd_constants": {"mu": consts.mu, "lr": consts.lr, "shift": consts.shift},
            "compile_s": round(compile_s, 3), "cached": all(s.cached for s in stages),
            "run_s": round(time.perf_counter() - t_all, 3), "cache": str(cache),
            "not_in_hls": ["loss gradient (host: train_fixed.softmax_xent_grad)",
                           "stashes (host replay of the fixed-point forward; forward kernels do not write them)"]}
