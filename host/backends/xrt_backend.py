"""The xrt backend: the generated pipeline on real Alveo boards through pyxrt.

Written against XRT's documented Python binding (pyxrt; XRT docs "XRT Python Bindings"
and the Vitis "Hello World Python" example): ``pyxrt.device(i)`` opens board i,
``pyxrt.xclbin(path)`` + ``device.load_xclbin`` programs it, ``pyxrt.kernel(device,
uuid, "kernel:{cu}")`` names a compute unit, ``pyxrt.bo(device, nbytes, pyxrt.bo.normal,
kernel.group_id(arg))`` allocates a buffer in the memory bank the argument is wired to,
``bo.sync(XCL_BO_SYNC_BO_TO_DEVICE/FROM_DEVICE, nbytes, 0)`` moves it, and a
``pyxrt.run`` with ``set_arg``/``start``/``wait`` executes a kernel.

Board k of the plan runs ``build/<board>.xclbin`` (bapipe gen's link cfg): free-running
stage kernels (ap_ctrl_none) joined board to board by the network kernels. The host only
touches the ends: ``mm2s`` data movers on the first board, ``s2mm`` on the last. The
output DMAs are started before the input ones, so the last board is draining before the
first one is fed and no stream stalls on a full FIFO.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import BackendUnavailable

WAIT_MS = 60_000


def _pyxrt():
    try:
        import pyxrt  # noqa: F401  (ships with XRT: source /opt/xilinx/xrt/setup.sh)
    except ImportError:
        raise BackendUnavailable("backend xrt: pyxrt is not importable (install XRT and "
                                 "`source /opt/xilinx/xrt/setup.sh`); no Alveo board can be driven here") from None
    return pyxrt


def check(options: dict) -> None:
    """pyxrt importable, one board per stage present, and an xclbin per board in the build."""
    pyxrt = _pyxrt()
    plan = options["plan"]
    boards = [s.boards[0] for s in plan.stages]
    try:
        found = len(pyxrt.enumerate_devices())
    except Exception as e:  # driver not loaded
        raise BackendUnavailable(f"backend xrt: cannot list devices ({e})") from None
    if found < len(boards):
        raise BackendUnavailable(f"backend xrt: the plan needs {len(boards)} boards, XRT sees {found}")
    build = Path(options.get("build") or "build")
    for b in boards:
        if not (build / f"{b}.xclbin").exists():
            raise BackendUnavailable(f"backend xrt: {build / (b + '.xclbin')} not found; build it with v++ "
                                     f"from `bapipe gen` ({build}/{b}.cfg)")


def make_stage(model, first, last, quant, options):
    """Per-stage training is not available on boards: the generated kernels are forward-only."""
    raise BackendUnavailable("backend xrt: generated kernels compute the forward pass only; train with --backend numpy")


def _ports(plan, model, cluster):
    from codegen.context import build_project

    ctx = build_project(plan, model, cluster)
    return ctx.stages, ctx.fmt


def forward(plan, model, cluster, params, x_q: np.ndarray, options: dict) -> np.ndarray:
    """Stream the raw inputs through the boards; return the raw outputs (N, out_elems)."""
    pyxrt = _pyxrt()
    build = Path(options.get("build") or "build")
    stages, fmt = _ports(plan, model, cluster)
    dtype = {8: np.int8, 16: np.int16, 32: np.int32}[fmt.width]
    n = len(x_q)
    x = np.asarray(x_q)
    if x.ndim == 4:  # images travel channel-last on the wire (HWC), as the generator streams them
        x = x.transpose(0, 2, 3, 1)
    x = np.ascontiguousarray(x.reshape(n, -1).astype(dtype))
    devices, uuids = [], []
    for k, st in enumerate(plan.stages):
        dev = pyxrt.device(k)
        uuids.append(dev.load_xclbin(pyxrt.xclbin(str(build / f"{st.boards[0]}.xclbin"))))
        devices.append(dev)
    first, last = stages[0], stages[-1]
    out_elems = int(np.prod(model.layers[-1].out_shape))
    # output movers first: s2mm(in_stream, mem, n) -> args 1 (mem) and 2 (n)
    outs = []
    for port in last.outputs:
        k = pyxrt.kernel(devices[-1], uuids[-1], f"s2mm:{{s2mm_{last.name}_{port.name}}}")
        nbytes = n * port.elements * np.dtype(dtype).itemsize
        bo = pyxrt.bo(devices[-1], nbytes, pyxrt.bo.normal, k.group_id(1))
        run = pyxrt.run(k)
        run.set_arg(1, bo)
        run.set_arg(2, n * port.elements)
        run.start()
        outs.append((run, bo, nbytes, port))
    ins = []
    for port in first.inputs:  # mm2s(mem, out_stream, n) -> args 0 (mem) and 2 (n)
        k = pyxrt.kernel(devices[0], uuids[0], f"mm2s:{{mm2s_{first.name}_{port.name}}}")
        data = x.tobytes()
        bo = pyxrt.bo(devices[0], len(data), pyxrt.bo.normal, k.group_id(0))
        bo.write(data, 0)
        bo.sync(pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, len(data), 0)
        run = pyxrt.run(k)
        run.set_arg(0, bo)
        run.set_arg(2, n * port.elements)
        run.start()
        ins.append(run)
    wait_ms = int(options.get("timeout", WAIT_MS / 1000) * 1000)
    for run in ins:
        _wait(pyxrt, run, wait_ms, "mm2s")
    results = []
    for run, bo, nbytes, port in outs:
        _wait(pyxrt, run, wait_ms, "s2mm")
        bo.sync(pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE, nbytes, 0)
        results.append(np.frombuffer(bytes(bo.read(nbytes, 0)), dtype=dtype).reshape(n, -1))
    y = results[0] if len(results) == 1 else np.concatenate(results, axis=1)
    return y.reshape(n, out_elems).astype(np.int64)


def _wait(pyxrt, run, ms: int, what: str) -> None:
    state = run.wait(ms)
    if state != pyxrt.ert_cmd_state.ERT_CMD_STATE_COMPLETED:
        raise BackendUnavailable(f"backend xrt: {what} did not complete within {ms} ms (state {state})")
