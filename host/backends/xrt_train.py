"""Training iterations on Alveo boards through pyxrt: the host side of a training build
(codegen/package/xrt_train.py writes what it reads: the ``train`` section of bapipe-build.json's
``xrt`` manifest).

Per board it opens the device once, loads the xclbin, and allocates every memory the
stage's kernels share once (the host passes one buffer to every kernel argument with the
same ``buffer`` key): the forward's banked weight arrays (from the stage's weight image), the backward's
16-bit weights, the gradient sums, master weights and velocities (from the host's initial
master weights, in the kernels' layout), the stash slots (S per stashed tensor, S =
bapipe.schedules.stash_count) and each kernel's scratch.

Per iteration, in the plan's schedule (bapipe.schedules.device_ops per stage):

- forward op F j: the input mover of stage 0 (its micro-batch, synced to the board), the
  forward kernel with stash slot j mod S (n = the replica's samples); on the last stage the
  loss kernel too (the micro-batch's labels) - the logits and their gradient never leave the
  board. Before F j overwrites a slot, the host waits for the backward of micro-batch j - S,
  the slot's last reader (too few slots for the schedule: refused in one line);
- backward op B j: the backward kernel with slot j mod S (flush 0);
- then every backward kernel's flush call (n = 0, flush = 1) writes the exact sums; the
  replicas' all-reduce kernels run at once (ring over the network kernels); every update
  kernel applies SGD with momentum (MU, LR, SHIFT: train_fixed.sgd_constants) and rewrites
  the 16-bit weights both other kernels read; the master weights are synced back.

Ops are issued across stages in dependency order (F j of a stage after F j of the one
before, B j after B j of the one after): kernels on different boards meet on streams, so every
op a run waits for has been started before the host waits on it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from bapipe.codegen.check.csim_train import _kernel_layout   # the kernels' weight layouts, one home
from bapipe.codegen.design.weight_image import to_model as _model_layout

from . import BackendUnavailable


def refused(man: dict) -> str | None:
    """Why the xrt host cannot train this build (one line), or None."""
    t = man.get("train")
    if not t:
        return "backend xrt: the build has no training manifest (re-run `bapipe gen` on the mode: train plan)"
    if t.get("refused"):
        return f"backend xrt: cannot train this build on boards: {t['refused']}"
    return None


class _Replica:
    """One replica of a stage on its board: kernels, shared buffers, runs in flight."""

    def __init__(self, pyxrt, board, st: dict, rank: int, build: Path, master: dict, tf, elem_dtype):
        self.st, self.rank, self.board = st, rank, board
        self.kern = {}
        for role in ("forward", "backward", "update", "allreduce"):
            if st.get(role):
                self.kern[role] = board.kernel(pyxrt, st[role]["kernel"], st[role]["instance"])
        self.bos: dict = {}
        self.pyxrt = pyxrt
        self.bwd_runs: dict[int, object] = {}
        self.pending: list = []   # (run, what) started and not yet waited for
        to_dev = pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE
        for role, k in self.kern.items():
            for a in st[role]["args"]:
                key = a.get("buffer")
                if a["kind"] == "stash":
                    for s in range(st["slots"]):
                        if (key, s) not in self.bos:
                            self.bos[(key, s)] = pyxrt.bo(board.device, a["bytes"], pyxrt.bo.normal, k.group_id(a["index"]))
                    continue
                if a["kind"] == "scratch":
                    self.bos[(role, a["name"])] = pyxrt.bo(board.device, a["bytes"], pyxrt.bo.normal,
                                                           k.group_id(a["index"]))
                    continue
                if key is None or key in self.bos:
                    continue
                bo = pyxrt.bo(board.device, a["bytes"], pyxrt.bo.normal, k.group_id(a["index"]))
                data = self._initial(a, build, master, tf, elem_dtype)
                if data is not None:
                    bo.write(data, 0)
                    bo.sync(to_dev, len(data), 0)
                self.bos[key] = bo

    def _initial(self, a: dict, build: Path, master: dict, tf, elem_dtype) -> bytes | None:
        """The bytes a shared buffer starts with (None: the kernels write it first)."""
        from bapipe.fpga_models import train_fixed as T

        k = a["kind"]
        if k == "weights":   # the forward's banked arrays: the build's image
            if "file" not in a:
                return None
            with open(build / a["file"], "rb") as f:
                f.seek(a["offset"])
                data = f.read(a["bytes"])
            if len(data) != a["bytes"]:
                raise BackendUnavailable(f"backend xrt: {build / a['file']} holds fewer bytes than {a['name']} needs")
            return data
        if k == "master":   # whole words (codegen.package.xrt_train): the pad lanes zero
            data = _kernel_layout(master[a["layer"]][a["key"]]).astype("<i4").tobytes()
            return data + bytes(a["bytes"] - len(data))
        if k in ("velocity", "grad"):   # zeros: the pad lanes of the words the kernels stream stay zero
            return bytes(a["bytes"])
        if k == "weights16":   # the 16-bit copy of the master weights, kernel layout
            up = next((x for x in self.st["update"]["args"] if x.get("buffer") == a["buffer"].replace("w16:", "master:")),
                      None) if self.st.get("update") else None
            if up is None:
                return None
            q = T.rescale(_kernel_layout(master[up["layer"]][up["key"]]), tf.master.frac, tf.act)
            data = np.asarray(q).astype(elem_dtype).tobytes()
            return data + bytes(a["bytes"] - len(data))
        return None

    def run(self, role: str, scalars: dict, slot: int | None = None):
        """Start one call of ``role``'s kernel with its buffers and ``scalars`` (by kind)."""
        r = self.pyxrt.run(self.kern[role])
        for a in self.st[role]["args"]:
            k = a["kind"]
            if k == "stream":
                continue
            if k == "stash":
                r.set_arg(a["index"], self.bos[(a["buffer"], slot or 0)])
            elif k == "scratch":
                r.set_arg(a["index"], self.bos[(role, a["name"])])
            elif a.get("buffer"):
                r.set_arg(a["index"], self.bos[a["buffer"]])
            else:
                r.set_arg(a["index"], scalars[k])
        r.start()
        self.pending.append((r, f"{self.st[role]['instance']}"))
        return r


def _wait(pyxrt, run, ms: int, what: str) -> None:
    state = run.wait(ms)
    if state != pyxrt.ert_cmd_state.ERT_CMD_STATE_COMPLETED:
        raise BackendUnavailable(f"backend xrt: {what} did not complete within {ms} ms (state {state})")


def train_iterations(plan, model, cluster, master, x_q, labels, dy, iterations: int, consts, tf,
                     options: dict) -> dict:
    """Train ``iterations`` iterations on the boards (module docstring); returns the master
    weights read back after each ({"weights": [{layer: {key: raw}}]}), as host/train_hw.py
    compares them with numpy's. ``dy`` is not used: the loss kernel computes it on the board.
    ``options["stash_slots"]`` (tests) overrides the slots the host cycles through."""
    from bapipe.fpga_models.train_fixed import as_schedule

    from .xrt_device import WAIT_MS, _pyxrt, read_manifest

    pyxrt = _pyxrt()
    build = Path(options.get("build") or "build")
    man = read_manifest(build, plan)
    why = refused(man)
    if why:
        raise BackendUnavailable(why)
    t = man["train"]
    dtype = {1: np.int8, 2: np.int16}[man["elem_bytes"]]
    x = np.asarray(x_q)
    if x.ndim == 4:   # HWC on the wire
        x = x.transpose(0, 2, 3, 1)
    x = np.ascontiguousarray(x.reshape(len(x), -1).astype(dtype))
    per_it = t["microbatches"] * t["microbatch_size"]
    if len(x) < iterations * per_it:
        raise BackendUnavailable(f"backend xrt: {iterations} iterations need {iterations * per_it} samples, got {len(x)}")
    s = _Session(pyxrt, build, man, master, tf, dtype, x, np.asarray(labels, dtype=np.int64),
                 int(options.get("timeout", WAIT_MS / 1000) * 1000), options.get("stash_slots"))
    sched = as_schedule(consts)   # the update kernel takes its rate as an s_axilite argument each iteration
    weights = []
    for it in range(iterations):
        s.schedule(it)
        s.finish(sched.at(it))
        weights.append(s.masters(master))
    return {"weights": weights, "op_order": s.order}


class _Session:
    """The boards of one training run: replicas, input movers and loss kernels, and the op order
    the host issued."""

    def __init__(self, pyxrt, build: Path, man: dict, master: dict, tf, dtype, x: np.ndarray, labels: np.ndarray,
                 wait_ms: int, stash_slots):
        from .xrt_device import _Board
        from .xrt_net import bring_up

        t = man["train"]
        self.pyxrt, self.t, self.x, self.labels, self.wait_ms = pyxrt, t, x, labels, wait_ms
        self.m, self.size = t["microbatches"], t["microbatch_size"]
        self.stages = sorted(t["stages"], key=lambda s: s["position"])
        self.p = len(self.stages)
        self.boards = {b["name"]: _Board(pyxrt, build, b) for b in man["boards"]}
        bring_up(pyxrt, build, self.boards)   # VNx addresses and sockets before any transfer
        self.reps = {st["position"]: [_Replica(pyxrt, self.boards[bn], st, k, build, master, tf, dtype)
                                      for k, bn in enumerate(st["boards"])] for st in self.stages}
        self.slots = {d: int(stash_slots or st["slots"]) for d, st in enumerate(self.stages)}
        first = self.stages[0]["stage"]
        self.movers = {b["name"]: [i for i in b["inputs"] if i["stage"] == first] for b in man["boards"]}
        self.lk = t["loss"]
        self.loss_k = {bn: self.boards[bn].kernel(pyxrt, self.lk["kernel"], self.lk["instance"])
                       for bn in self.lk["boards"]}
        self.order: list = []
        self.base = 0
        self.issued: set = set()

    def schedule(self, it: int) -> None:
        """Issue iteration ``it``'s forward and backward ops in the schedule's order per stage,
        each as soon as its input is issued."""
        from bapipe.schedules import device_ops

        self.base, self.issued = it * self.m * self.size, set()
        ops = {d: [o for o in device_ops(self.t["schedule"], self.p, d, self.m) if o.kind in ("F", "B")]
               for d in range(self.p)}
        ptr = {d: 0 for d in range(self.p)}
        while any(ptr[d] < len(ops[d]) for d in range(self.p)):
            moved = False
            for d in range(self.p):
                while ptr[d] < len(ops[d]):
                    o = ops[d][ptr[d]]
                    ready = (d == 0 or ("F", d - 1, o.mb) in self.issued) if o.kind == "F" else \
                        (d == self.p - 1 or ("B", d + 1, o.mb) in self.issued)
                    if not ready:
                        break
                    self._issue(it, d, o)
                    ptr[d] += 1
                    moved = True
            if not moved:
                raise BackendUnavailable(f"backend xrt: the {self.t['schedule']} op orders of the stages wait on "
                                         f"each other")

    def _shard(self, d: int, k: int, j: int) -> np.ndarray:
        """The samples replica k of stage d computes in micro-batch j."""
        mb = self.stages[d]["mb"]
        return np.arange(self.base + j * self.size + k * mb, self.base + j * self.size + (k + 1) * mb)

    def _issue(self, it: int, d: int, o) -> None:
        st = self.stages[d]
        for k, r in enumerate(self.reps[d]):
            slot = o.mb % self.slots[d]
            if o.kind == "B":
                r.bwd_runs[o.mb] = r.run("backward", {"samples": st["mb"], "flush": 0}, slot)
                continue
            prev = o.mb - self.slots[d]
            if prev >= 0:   # the slot's last reader must be done before it is overwritten
                if ("B", d, prev) not in self.issued:
                    raise BackendUnavailable(
                        f"backend xrt: {st['name']} has {self.slots[d]} stash slot(s): the forward of micro-batch "
                        f"{o.mb} would overwrite micro-batch {prev}'s stash before its backward runs "
                        f"({self.t['schedule']} needs {st['slots']})")
                _wait(self.pyxrt, r.bwd_runs[prev], self.wait_ms, st["backward"]["instance"])
            if d == 0:
                self._feed(r, st["boards"][k], self._shard(d, k, o.mb))
            r.run("forward", {"samples": st["mb"]}, slot)
            if d == self.p - 1:   # the loss kernel turns the logits into dz on the board
                self._loss(r, st["boards"][k], self._shard(d, k, o.mb), st["mb"])
        self.issued.add((o.kind, d, o.mb))
        self.order.append((it, st["name"], f"{o.kind}{o.mb}"))

    def _feed(self, r, bn: str, samples: np.ndarray) -> None:
        """The input movers of board bn stream the samples into the first stage."""
        pyxrt = self.pyxrt
        for i in self.movers[bn]:
            kern = self.boards[bn].kernel(pyxrt, i["kernel"], i["instance"])
            data = self.x[samples].tobytes()
            bo = pyxrt.bo(self.boards[bn].device, len(data), pyxrt.bo.normal, kern.group_id(i["args"]["mem"]))
            bo.write(data, 0)
            bo.sync(pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, len(data), 0)
            run = pyxrt.run(kern)
            run.set_arg(i["args"]["mem"], bo)
            run.set_arg(i["args"]["n"], len(data) // self.x.itemsize)
            run.start()
            r.pending.append((run, i["instance"]))

    def _loss(self, r, bn: str, samples: np.ndarray, n: int) -> None:
        """The loss kernel of board bn gets the samples' labels."""
        pyxrt = self.pyxrt
        lab = self.labels[samples].astype("<i4").tobytes()
        kern = self.loss_k[bn]
        bo = pyxrt.bo(self.boards[bn].device, len(lab), pyxrt.bo.normal, kern.group_id(2))
        bo.write(lab, 0)
        bo.sync(pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, len(lab), 0)
        run = pyxrt.run(kern)
        run.set_arg(2, bo)
        run.set_arg(3, n)
        run.start()
        r.pending.append((run, self.lk["instance"]))

    def _drain(self, r) -> None:
        for run, what in r.pending:
            _wait(self.pyxrt, run, self.wait_ms, what)
        r.pending = []

    def finish(self, c) -> None:
        """The iteration's end: the flush (every backward kernel writes its exact sums), the
        replicas' all-reduce (all started, then all waited for), then the update with rate ``c``."""
        every = [r for d in range(self.p) for r in self.reps[d]]
        for r in every:
            r.run("backward", {"samples": 0, "flush": 1}, 0)
        for r in every:
            self._drain(r)
            r.bwd_runs = {}
        for d in range(self.p):
            if self.stages[d].get("allreduce"):
                for r in self.reps[d]:
                    r.run("allreduce", {"rank": r.rank, "replicas": len(self.reps[d])})
                for r in self.reps[d]:
                    self._drain(r)
        for d in range(self.p):
            if self.stages[d].get("update"):
                for r in self.reps[d]:
                    r.run("update", {"mu": c.mu, "lr": c.lr, "shift": c.shift})
                    self._drain(r)

    def masters(self, master: dict) -> dict:
        """Replica 0's master weights of every stage (the all-reduce makes every replica's equal)."""
        from_dev = self.pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE
        got: dict = {}
        for d in range(self.p):
            r = self.reps[d][0]
            for a in (self.stages[d]["update"] or {"args": []})["args"]:
                if a["kind"] != "master":
                    continue
                bo = r.bos[a["buffer"]]
                bo.sync(from_dev, a["bytes"], 0)
                raw = np.frombuffer(bytes(bo.read(a["bytes"], 0)), dtype="<i4").astype(np.int64)
                raw = raw[:a.get("elements", raw.size)]   # whole words: the pad lanes dropped
                shape = np.shape(master[a["layer"]][a["key"]])
                got.setdefault(a["layer"], {})[a["key"]] = _model_layout(raw, shape)
        return got
