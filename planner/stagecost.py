"""Stage costs from per-layer arrays: what a contiguous run of layers costs on one board.

The partition search asks for the cost of many ranges [i, j] at once, so every figure is a
prefix sum over layers and a range costs O(1) (vectorised with numpy). The model:

- compute: each layer runs at its best folding on the whole budget of the board (the
  time-multiplexed style: layers take turns on the shared DSPs), cycles from
  fpga_models.cost; a stage's compute is the sum over its layers;
- memory per board: weights x copies (gradient, optimizer state, 2BW's second version,
  PipeDream's second gradient buffer) + stashed activations (stash count x per-micro-batch
  bytes; PipeDream also stashes a weight version per micro-batch) + line buffers;
  must fit on chip (x cap) + off-chip;
- spill roofline: on-chip holds weights first, then gradients, then stashes; spilled
  weights are read once per forward and once per backward, spilled gradients read and
  written once per backward, spilled stashes written in forward and read in backward.
  Stage time = max(compute, off-chip traffic / off-chip bandwidth), per pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bapipe.spec import Model
from bapipe.layers import TRAIN_ONLY
from bapipe.fpga_models.boards import Board, bytes_per_element
from bapipe.fpga_models.allocate import kernel_share, tm_fixed_bytes
from bapipe.fpga_models.gradients import backward_work, no_input_gradient
from bapipe.fpga_models.engines import TM_SWITCH, engine_kind, turn_fill, work_cycles
from bapipe.fpga_models.cost import (best_folding, layer_cost, elementwise_work, gpu_layer_cost, matrix_shape, onchip_capacity,
                              weight_copies)


@dataclass
class LayerTable:
    """Per-layer arrays of a model on one board type (folding chosen for the whole board)."""

    board: Board
    fold: list[tuple[int, int]]
    fwd_work: np.ndarray      # MACs (MVU) or element-ops per sample, forward
    bwd_work: np.ndarray      # input-grad (fpga_models.gradients) + weight-grad work per sample
    lanes: np.ndarray         # PE*SIMD (MVU) or lanes (elementwise)
    gpu_f: np.ndarray | None  # GPU roofline seconds per sample (None on FPGAs)
    gpu_b: np.ndarray | None
    measured_f: np.ndarray | None = None   # measured seconds per sample (profile hook)
    measured_b: np.ndarray | None = None
    fill: np.ndarray | None = None         # FPGA: cycles each layer's turn adds per sample (engine fill)
    fill_f: np.ndarray | None = None       # FPGA: the same for forward turns (the MVU's adder tree: engines.mvu_fill)


def layer_table(model: Model, board: Board, fmt: str, cap: float, measured: dict | None = None,
                train: bool = False) -> LayerTable:
    """Per-layer work and folding of ``model`` on ``board`` (tm style: each layer gets the whole
    budget). Forward turns' fill: the inference MVU's adder tree (engines.mvu_fill of its SIMD);
    ``train`` plans run the training engines, whose forward keeps the SIMD = 1 fill."""
    n = len(model.layers)
    fw, bw, lanes = np.zeros(n), np.zeros(n), np.ones(n)
    fold = []
    gf = gb = None
    if board.kind == "gpu":
        gf, gb = np.zeros(n), np.zeros(n)
        for k, l in enumerate(model.layers):
            g = gpu_layer_cost(l, board, fmt, 1)
            gf[k], gb[k] = g.fwd_s, g.bwd_s
            fold.append((1, 1))
    else:
        no_dx = no_input_gradient(model)   # the model input's gradient is never computed
        for k, l in enumerate(model.layers):
            pe, simd = best_folding(l, board, fmt, board.usable_dsp * cap, board.usable_lut * cap)
            fold.append((pe, simd))
            lanes[k] = pe * simd
            dx = l.name not in no_dx
            if matrix_shape(l) is not None:
                fw[k], bw[k] = l.fwd_macs, backward_work(l.bwd_in_macs, l.bwd_w_macs, dx)
                if l.type == "conv2d":   # a window generator slower than the MVU bounds the layer
                    fw[k] = max(fw[k], layer_cost(l, board, pe, simd, fmt).fwd_cycles * lanes[k])
            else:
                fw[k], bw[k] = elementwise_work(l)
                bw[k] = backward_work(bw[k], 0, dx)
    fill = fill_f = None   # GPU boards: no engine fills
    if board.kind != "gpu":
        fill = np.array([turn_fill(engine_kind(l.type)) for l in model.layers], dtype=float)
        fill_f = None if train else np.array([turn_fill(engine_kind(l.type), s) for l, (_p, s)
                                              in zip(model.layers, fold)], dtype=float)
    t = LayerTable(board, fold, fw, bw, lanes, gf, gb, fill=fill, fill_f=fill_f)
    if measured:
        t.measured_f = np.array([measured[l.name]["fwd_s"] for l in model.layers], dtype=float)
        t.measured_b = np.array([measured[l.name]["bwd_s"] for l in model.layers], dtype=float)
    return t


def layer_times(t: LayerTable, beta: int) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds per layer for a micro-batch of ``beta`` samples on one board.

    FPGA: ceil(work * beta / lanes) cycles at the board clock (FINN MVU formula) plus the
    engine's fill for every sample's turn (fpga_models.engines.turn_fill).
    Measured profiles and GPU rooflines scale linearly with beta (per-sample figures).
    """
    if t.measured_f is not None:
        return t.measured_f * beta, t.measured_b * beta
    if t.gpu_f is not None:
        return t.gpu_f * beta, t.gpu_b * beta
    clk = t.board.clock_hz
    fill = t.fill * beta if t.fill is not None else 0.0   # every turn's fill, per sample
    fill_f = t.fill_f * beta if t.fill_f is not None else fill
    f = (work_cycles(t.fwd_work, t.lanes, beta) + np.where(t.fwd_work > 0, fill_f, 0.0)) / clk
    b = (work_cycles(t.bwd_work, t.lanes, beta) + np.where(t.bwd_work > 0, fill, 0.0)) / clk
    return f, b


@dataclass
class StageModel:
    """Prefix sums for O(1) stage costs of one board type at one micro-batch size."""

    board: Board
    beta: int
    mode: str
    recompute: bool
    copies: int
    onchip: int
    capacity: int
    PF: np.ndarray   # prefix forward seconds
    PB: np.ndarray   # prefix backward seconds
    PW: np.ndarray   # prefix weight bytes
    PA: np.ndarray   # prefix stash bytes per micro-batch (inputs of every layer)
    PBUF: np.ndarray  # prefix line-buffer bytes
    IN: np.ndarray   # bytes entering a stage that starts at layer i (per micro-batch)
    switch_s: float = 0.0  # FPGA: the sequencer's switch between jobs, per micro-batch
    stash_weights: bool = False   # PipeDream: every stash also holds its weight version
    fits: object = None   # FPGA: () -> [i, j] the kernels of layers i..j fit the board's blocks (built once, lazily)

    def weight_copies_at(self, stashes):
        """Weight-sized buffers of a stage with ``stashes`` in flight: ``copies`` plus, with
        weight stashing, the s - 1 versions older than the current weights."""
        if self.stash_weights and self.mode == "train":
            return self.copies + np.maximum(np.asarray(stashes) - 1, 0)
        return self.copies

    def cost(self, i, j, stashes, share: int = 1):
        """Vectorised stage figures for layers i..j (inclusive) with ``stashes`` in-flight micro-batches.

        ``share``: the stage gets 1/share of the board's memory (interleaved: v chunks per board).
        Returns a dict of arrays: fwd_s, bwd_s, time_s, memory, weight_bytes, stash_bytes, feasible.
        """
        return self.cost_of(self.ranges(i, j), stashes, share)

    def ranges(self, i, j) -> dict:
        """The stash-independent sums over layers i..j (reuse them for several stash counts)."""
        i = np.asarray(i)
        j = np.asarray(j)
        return {"F": self.PF[j + 1] - self.PF[i], "B": self.PB[j + 1] - self.PB[i], "W": self.PW[j + 1] - self.PW[i],
                "A": self.PA[j + 1] - self.PA[i], "buf": self.PBUF[j + 1] - self.PBUF[i], "IN": self.IN[i],
                "fit": self.fit_matrix()[i, j] if self.fits is not None else None}

    def fit_matrix(self) -> np.ndarray:
        """The block-fit mask ``fits`` builds (planner.search.Explorer.block_mask), once."""
        got = self.__dict__.get("_fit_matrix")
        if got is None:
            got = self.fits(self)
            self.__dict__["_fit_matrix"] = got
        return got

    def cost_of(self, rg: dict, stashes, share: int = 1):
        """:meth:`cost` from precomputed :meth:`ranges`."""
        F, Bc, W, A, buf = rg["F"], rg["B"], rg["W"], rg["A"], rg["buf"]
        train = self.mode == "train"
        if self.switch_s:
            F = F + self.switch_s
            Bc = Bc + np.where(Bc > 0, self.switch_s, 0.0)
        if train and self.recompute:
            Bc = Bc + F                       # re-run the forward before the backward
            stash_mb = rg["IN"]
            stash = stashes * stash_mb + A    # + one micro-batch's activations while it backpropagates
        elif train:
            stash_mb = A
            stash = stashes * A
        else:
            stash_mb = np.zeros_like(A)
            stash = A                         # working activations of one micro-batch
        copies = self.copies
        if train and self.stash_weights:
            # PipeDream's weight stashing: each in-flight micro-batch keeps its weight version
            # (the newest is the current weights, counted in copies): the stash of a micro-batch
            # is its activations plus W, and one copy moves from the fixed part into the stashes
            stash_mb = stash_mb + W
            stash = stash + stashes * W
            copies = self.copies - 1
        mem = W * copies + stash + buf
        feasible = mem <= self.capacity / share
        if self.board.kind == "fpga":
            # the forward kernel's line buffers stay on chip (its frame buffers can go off chip):
            # within the kernel's share of on-chip memory (fpga_models.allocate, the lowering's rule)
            feasible = feasible & (buf <= kernel_share(self.onchip, share, train))
            if rg.get("fit") is not None:   # and its kernels' BRAM and URAM (planner.search.Explorer.block_mask)
                feasible = feasible & rg["fit"]
        if self.board.kind == "gpu":
            fs, bs = F, Bc
            tr_f = tr_b = np.zeros_like(F)
        else:
            on = np.full(np.shape(W), float(self.onchip) / share) - buf
            w_on = np.clip(on, 0, None)
            w_on = np.minimum(W, w_on)
            w_off = W - w_on
            on2 = np.clip(on - W, 0, None)
            if train:
                g_on = np.minimum(W, on2)
                g_off = W - g_on
                on3 = np.clip(on2 - W, 0, None)
                s_on = np.minimum(stash, on3)
                phi = np.where(stash > 0, (stash - s_on) / np.maximum(stash, 1), 0.0)
                tr_f = w_off + phi * stash_mb
                tr_b = w_off + 2 * g_off + phi * stash_mb
            else:
                tr_f = w_off
                tr_b = np.zeros_like(W)
            bwb = self.board.offchip_bw_Bps
            tr_f, tr_b = tr_f / bwb, tr_b / bwb
            fs = np.maximum(F, tr_f)
            bs = np.maximum(Bc, tr_b) if train else np.zeros_like(F)
        if not train:
            bs = np.zeros_like(fs)
        return {"fwd_s": fs, "bwd_s": bs, "time_s": fs + bs, "memory": mem, "weight_bytes": W,
                "stash_bytes": stash, "feasible": feasible, "compute_f": F, "compute_b": Bc,
                "traffic_f": tr_f, "traffic_b": tr_b, "stash_mb": stash_mb,
                "fixed_bytes": W * copies + buf + (A if (not train or self.recompute) else 0 * A)}


def stage_model(model: Model, table: LayerTable, beta: int, fmt: str, cap: float, mode: str, optimizer: str,
                versions: int, recompute: bool, stash_weights: bool = False, grad_buffers: int = 1) -> StageModel:
    """Prefix sums of ``table`` for micro-batches of ``beta`` samples. ``versions``: weight
    copies besides stashed ones (2BW: 2); ``stash_weights``: PipeDream's version per stash;
    ``grad_buffers``: gradient buffers (PipeDream: 2, bapipe.schedules.gradient_buffers)."""
    bpe = bytes_per_element(fmt)
    f, b = layer_times(table, beta)
    n = len(model.layers)
    if mode != "train":   # dropout and its kind are the identity at inference (bapipe.layers.TRAIN_ONLY)
        idle = np.array([l.type in TRAIN_ONLY for l in model.layers])
        if idle.any():
            f, b = np.where(idle, 0.0, f), np.where(idle, 0.0, b)
    w = np.array([l.params * bpe for l in model.layers], dtype=float)
    a = np.array([l.in_elems * bpe * beta for l in model.layers], dtype=float)
    buf = np.zeros(n)
    if table.board.kind == "fpga":
        for k, l in enumerate(model.layers):
            buf[k] = tm_fixed_bytes([l], fmt)   # its window generator's ring (fpga_models.allocate)
    cut = model.cut_elements_all
    first_in = sum(math.prod(i.shape) for i in model.inputs)
    IN = np.array([first_in] + list(cut), dtype=float) * bpe * beta
    z = lambda x: np.concatenate([[0.0], np.cumsum(x)])  # noqa: E731
    board = table.board
    onchip = onchip_capacity(board, cap) if board.kind == "fpga" else 0
    copies = weight_copies(optimizer, mode, versions) + (grad_buffers - 1 if mode == "train" else 0)
    return StageModel(board, beta, mode, recompute, copies, onchip,
                      onchip + board.offchip_bytes, z(f), z(b), z(w), z(a), z(buf), IN,
                      TM_SWITCH * beta / board.clock_hz if board.kind == "fpga" and table.measured_f is None else 0.0,
                      stash_weights and mode == "train")


def cut_bytes(model: Model, fmt: str, beta: int) -> np.ndarray:
    """Activation bytes per micro-batch crossing the cut after each layer (length n-1)."""
    return np.array(model.cut_elements_all, dtype=float) * bytes_per_element(fmt) * beta
