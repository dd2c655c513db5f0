"""The xrt backend: the generated pipeline on real Alveo boards through pyxrt.

Written against XRT's documented Python binding (pyxrt; XRT docs "XRT Python Bindings"
and the Vitis "Hello World Python" example): ``pyxrt.device(i)`` opens board i,
``pyxrt.xclbin(path)`` + ``device.load_xclbin`` programs it, ``pyxrt.kernel(device,
uuid, "kernel:{cu}")`` names a compute unit, ``pyxrt.bo(device, nbytes, pyxrt.bo.normal,
kernel.group_id(arg))`` allocates a buffer in the memory bank the argument is wired to,
``bo.sync(XCL_BO_SYNC_BO_TO_DEVICE/FROM_DEVICE, nbytes, 0)`` moves it, and a
``pyxrt.run`` with ``set_arg``/``start``/``wait`` executes a kernel.

Everything it does is read from the build's ``bapipe-build.json`` (the ``xrt`` section,
written by ``codegen.package.kernels.xrt_manifest``): per board the device index and the xclbin
the Makefile links (``link/<board>.xclbin``), one ``pyxrt.device`` per board however
many stages it runs; per kernel instance its control protocol and arguments; the m_axi
weight buffers with their sizes and the kernel-layout image they are loaded from; the
mm2s/s2mm movers the host feeds and drains.

Start order: the output movers first (the last board drains before anything is fed), then
the ap_ctrl_hs stage kernels that run once per call (RTL kernels: ``samples`` = N),
downstream first, then the input movers; HLS stage kernels with m_axi weights process one
sample per call, so each sample starts all of them (downstream first) and waits for them.
Free-running kernels (ap_ctrl_none) are never started.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import BackendUnavailable
from .xrt_device import WAIT_MS, _Board, _pyxrt, read_manifest

#: per-stage training (the host driver's workers) is not how boards train: `bapipe run
#: --backend xrt --epochs` trains through host/train_hw.py and :func:`train_iterations`
TRAINING_PER_STAGE = ("backend xrt: boards train whole iterations (train_iterations: forward, loss, backward, "
                      "all-reduce and update kernels in the schedule's order), not stage by stage")


def check(options: dict) -> None:
    """pyxrt importable, the plan's build present, one board per xclbin seen by XRT, every
    xclbin built; a training build also needs its training manifest (host/backends/xrt_train.py)."""
    pyxrt = _pyxrt()
    plan = options["plan"]
    if plan.mode != "train" and len(plan.stages) > 1 and any(s.replicas > 1 for s in plan.stages):
        raise BackendUnavailable("backend xrt: data-parallel replicas of a multi-stage plan are not driven yet "
                                 "(one board per stage, or one replicated stage)")
    build = Path(options.get("build") or "build")
    man = read_manifest(build, plan)
    if plan.mode == "train":
        from .xrt_train import refused

        why = refused(man)
        if why:
            raise BackendUnavailable(why)
    try:
        found = len(pyxrt.enumerate_devices())
    except Exception as e:  # driver not loaded
        raise BackendUnavailable(f"backend xrt: cannot list devices ({e})") from None
    need = 1 + max((b["device"] for b in man["boards"]), default=-1)
    if found < need:
        raise BackendUnavailable(f"backend xrt: the build needs {need} boards, XRT sees {found}")
    for b in man["boards"]:
        if not (build / b["xclbin"]).exists():
            raise BackendUnavailable(f"backend xrt: {build / b['xclbin']} not found; build it with "
                                     f"`make xclbin` in {build}")


def make_stage(model, first, last, quant, options):
    """Per-stage training is not driven on boards (:data:`TRAINING_PER_STAGE`)."""
    raise BackendUnavailable(TRAINING_PER_STAGE)


def train_iterations(plan, model, cluster, master, x_q, labels, dy, iterations: int, consts, tf,
                     options: dict) -> dict:
    """Training iterations on the boards: host/backends/xrt_train.py."""
    from .xrt_train import train_iterations as run

    return run(plan, model, cluster, master, x_q, labels, dy, iterations, consts, tf, options)


def _weights(pyxrt, build: Path, board: _Board, kernel, entry: dict) -> dict:
    """Allocate and load the m_axi weight buffers of one kernel instance (sizes from the manifest);
    allocate its scratch buffers (off-chip frame buffers, nothing to load)."""
    bos = {}
    for a in entry["args"]:
        if a["kind"] == "scratch":
            bos[a["index"]] = pyxrt.bo(board.device, a["bytes"], pyxrt.bo.normal, kernel.group_id(a["index"]))
            continue
        if a["kind"] != "weights":
            continue
        with open(build / a["file"], "rb") as f:
            f.seek(a["offset"])
            data = f.read(a["bytes"])
        if len(data) != a["bytes"]:
            raise BackendUnavailable(f"backend xrt: {build / a['file']} holds fewer bytes than "
                                     f"{entry['instance']}.{a['name']} needs ({a['bytes']}); re-run `bapipe gen`")
        bo = pyxrt.bo(board.device, a["bytes"], pyxrt.bo.normal, kernel.group_id(a["index"]))
        bo.write(data, 0)
        bo.sync(pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, a["bytes"], 0)
        bos[a["index"]] = bo
    return bos


def _shares(boards: list[_Board], n: int) -> dict[str, tuple[int, int]]:
    """Samples each board handles, as (first, count). Boards fed by the host split the N
    samples into contiguous chunks in board order (data-parallel replicas of a one-stage plan;
    one fed board otherwise); every other board sees all N."""
    fed = [bd for bd in boards if bd.entry["inputs"]]
    out = {bd.entry["name"]: (0, n) for bd in boards}
    if len(fed) > 1:
        first = 0
        for bd, chunk in zip(fed, np.array_split(np.arange(n), len(fed))):
            out[bd.entry["name"]] = (first, len(chunk))
            first += len(chunk)
    return out


def forward(plan, model, cluster, params, x_q: np.ndarray, options: dict) -> np.ndarray:
    """Stream the raw inputs through the boards; return the raw outputs (N, out_elems).

    ``params`` is not sent: the kernels run the weights of the build (baked into the xclbin
    or loaded from its weight images), which are the generator's.
    """
    pyxrt = _pyxrt()
    build = Path(options.get("build") or "build")
    man = read_manifest(build, plan)
    dtype = {1: np.int8, 2: np.int16}[man["elem_bytes"]]
    n = len(x_q)
    x = np.asarray(x_q)
    if x.ndim == 4:  # images travel channel-last on the wire (HWC), as the generator streams them
        x = x.transpose(0, 2, 3, 1)
    x = np.ascontiguousarray(x.reshape(n, -1).astype(dtype))
    wait_ms = int(options.get("timeout", WAIT_MS / 1000) * 1000)
    boards = [_Board(pyxrt, build, b) for b in man["boards"]]   # one device per board
    from .xrt_net import bring_up
    bring_up(pyxrt, build, {bd.entry["name"]: bd for bd in boards})   # VNx addresses before any transfer
    share = _shares(boards, n)
    controlled = _controlled(pyxrt, build, boards, share)
    outs = _start_outputs(pyxrt, boards, share, dtype)
    once = _start_kernels(pyxrt, controlled, "once")
    ins = _start_inputs(pyxrt, boards, share, x, model.inputs[0].name)
    _run_per_sample(pyxrt, controlled, wait_ms)
    for run, i in ins:
        _wait(pyxrt, run, wait_ms, i["instance"])
    last = max(k["stage"] for b in man["boards"] for k in b["kernels"])
    results = _collect(pyxrt, outs, last, dtype, wait_ms)
    for run, k in once:
        _wait(pyxrt, run, wait_ms, k["instance"])
    if not results:
        raise BackendUnavailable("backend xrt: the build has no output mover on the last stage")
    ports = list(dict.fromkeys(p for p, _ in results))
    # rows of one port come board by board (the chunks' order); ports side by side
    y = np.concatenate([np.concatenate([r for p, r in results if p == q], axis=0) for q in ports], axis=1)
    return y.reshape(n, int(np.prod(model.layers[-1].out_shape))).astype(np.int64)


def _controlled(pyxrt, build: Path, boards: list[_Board], share: dict) -> list[tuple]:
    """Stage kernels under host control with their weight buffers, in reverse pipeline order
    (started downstream first)."""
    controlled = []
    for bd in boards:
        for k in bd.entry["kernels"]:
            if k["control"] != "hs":
                continue
            kern = bd.kernel(pyxrt, k["name"], k["instance"])
            bos = _weights(pyxrt, build, bd, kern, k)
            controlled.append((k["stage"], k, kern, bos, share[bd.entry["name"]][1]))
    controlled.sort(key=lambda c: -c[0])
    return controlled


def _start_outputs(pyxrt, boards: list[_Board], share: dict, dtype) -> list[tuple]:
    """The output movers, s2mm(in_stream, mem, n), started first."""
    outs = []
    for bd in boards:
        m = share[bd.entry["name"]][1]
        for o in bd.entry["outputs"]:
            kern = bd.kernel(pyxrt, o["kernel"], o["instance"])
            nbytes = m * o["elements"] * np.dtype(dtype).itemsize
            bo = pyxrt.bo(bd.device, nbytes, pyxrt.bo.normal, kern.group_id(o["args"]["mem"]))
            run = pyxrt.run(kern)
            run.set_arg(o["args"]["mem"], bo)
            run.set_arg(o["args"]["n"], m * o["elements"])
            run.start()
            outs.append((run, bo, nbytes, m, o))
    return outs


def _start_kernels(pyxrt, controlled: list[tuple], starts: str) -> list[tuple]:
    """Start the controlled kernels whose ``starts`` is ``starts`` (samples, weights, scratch set)."""
    started = []
    for _, k, kern, bos, m in controlled:
        if k["starts"] != starts:
            continue
        run = pyxrt.run(kern)
        for a in k["args"]:
            if a["kind"] == "samples":
                run.set_arg(a["index"], m)
            elif a["kind"] in ("weights", "scratch"):
                run.set_arg(a["index"], bos[a["index"]])
        run.start()
        started.append((run, k))
    return started


def _start_inputs(pyxrt, boards: list[_Board], share: dict, x: np.ndarray, model_input: str) -> list[tuple]:
    """The input movers, mm2s(mem, out_stream, n), each with its board's share of the samples."""
    ins = []
    for bd in boards:
        first, m = share[bd.entry["name"]]
        for i in bd.entry["inputs"]:
            if i["tensor"] != model_input:
                raise BackendUnavailable(f"backend xrt: {i['instance']} feeds {i['tensor']!r}, not the model input")
            kern = bd.kernel(pyxrt, i["kernel"], i["instance"])
            data = x[first:first + m].tobytes()
            bo = pyxrt.bo(bd.device, len(data), pyxrt.bo.normal, kern.group_id(i["args"]["mem"]))
            bo.write(data, 0)
            bo.sync(pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, len(data), 0)
            run = pyxrt.run(kern)
            run.set_arg(i["args"]["mem"], bo)
            run.set_arg(i["args"]["n"], m * i["elements"])
            run.start()
            ins.append((run, i))
    return ins


def _run_per_sample(pyxrt, controlled: list[tuple], wait_ms: int) -> None:
    """Kernels called once a sample: all start, then all finish, sample by sample."""
    runs = []
    for _, k, kern, bos, m in controlled:
        if k["starts"] != "per_sample":
            continue
        run = pyxrt.run(kern)
        for a in k["args"]:
            if a["kind"] == "weights":
                run.set_arg(a["index"], bos[a["index"]])
        runs.append((run, k, m))
    for j in range(max((m for _, _, m in runs), default=0)):
        live = [(run, k) for run, k, m in runs if j < m]
        for run, _k in live:
            run.start()
        for run, k in live:
            _wait(pyxrt, run, wait_ms, k["instance"])


def _collect(pyxrt, outs: list[tuple], last: int, dtype, wait_ms: int) -> list[tuple]:
    """(port, rows) the last stage's output movers wrote."""
    results = []
    for run, bo, nbytes, m, o in outs:
        _wait(pyxrt, run, wait_ms, o["instance"])
        bo.sync(pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE, nbytes, 0)
        if o["stage"] == last:
            results.append((o["port"], np.frombuffer(bytes(bo.read(nbytes, 0)), dtype=dtype).reshape(m, -1)))
    return results


def _wait(pyxrt, run, ms: int, what: str) -> None:
    state = run.wait(ms)
    if state != pyxrt.ert_cmd_state.ERT_CMD_STATE_COMPLETED:
        raise BackendUnavailable(f"backend xrt: {what} did not complete within {ms} ms (state {state})")
