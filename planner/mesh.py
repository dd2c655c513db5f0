"""Tensor-parallel (intra-layer, Megatron-style) stages on a mesh of k boards of one host.

The rule (Shoeybi et al. 2019, Megatron-LM; with the sequence parallelism of Korthikanti
et al. 2022, which splits the non-matrix layers along the sequence so every layer's work
divides by k and the collectives have the volume of Megatron's all-reduces):

- roles, fixed over the whole model: dense and conv2d layers with weights alternate
  column-parallel ("col": output features split) and row-parallel ("row": input features
  split) by their global ordinal, so fc1/fc2 of a transformer block form a pair;
  attention, additive attention and LSTM layers are a pair on their own ("pair": heads
  or gates split); an embedding is vocabulary-split ("out": its output is reduced); every
  other layer has no role (it runs on its sequence share);
- compute, weights, stashed activations and line buffers divide by k per board;
- collectives per micro-batch of beta samples, each an all-gather or reduce-scatter on a
  ring over the mesh, ``(k-1)/k * X / bw + (k-1) * lat`` for X bytes of the whole tensor:
  col: all-gather of its input forward, reduce-scatter of the input gradient backward;
  row: reduce-scatter of its output forward, all-gather of the output gradient backward;
  pair: both; out: one of its output each way;
- the activation crossing a cut is a 2-D tensor (rows, features): features are the last
  dimension of a sequence (S, F), the channels of an image (C, H, W); rows = the rest x
  beta. On a 1 x k mesh it is split on rows (``S1R``, the sequence-parallel layout) except
  inside an open col/row pair (after a col layer, before its row layer), where it is
  split on features (``RS1``). On one board both layouts mean the whole tensor.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from bapipe.spec import Model
from bapipe.fpga_models.boards import bytes_per_element

from .stagecost import StageModel

ROLE_PAIR = ("attention", "additive_attention", "lstm")
ROLE_ALT = ("dense", "conv2d")


def roles(model: Model) -> list[str | None]:
    """Tensor-parallel role of every layer: "col", "row", "pair", "out" or None (see module doc)."""
    out: list[str | None] = []
    alt = 0
    for l in model.layers:
        if l.type in ROLE_ALT and l.params > 0:
            out.append("col" if alt % 2 == 0 else "row")
            alt += 1
        elif l.type in ROLE_PAIR and l.params > 0:
            out.append("pair")
        elif l.type == "embedding" and l.params > 0:
            out.append("out")
        else:
            out.append(None)
    return out


def cut_layouts(model: Model) -> list[str]:
    """Layout of the activation after each layer on a 1 x k mesh: "RS1" inside an open
    col/row pair, "S1R" elsewhere (length n; the last entry is the model's output)."""
    out, open_pair = [], False
    for r in roles(model):
        if r == "col":
            open_pair = True
        elif r == "row":
            open_pair = False
        out.append("RS1" if open_pair else "S1R")
    return out


def cut_shape(model: Model, j: int, beta: int) -> tuple[int, int]:
    """2-D (rows, features) form of the activation crossing the cut after layer j, for a
    micro-batch of ``beta`` samples (every tensor crossing the cut, skip connections too)."""
    shp = model.layers[j].out_shape
    feat = int(shp[-1] if len(shp) == 2 else shp[0])
    elems = int(model.cut_elements_all[j]) if j < len(model.layers) - 1 else int(math.prod(shp))
    feat = max(1, min(feat, elems))
    return (max(1, -(-elems * beta // feat)), feat)


def collective_s(nbytes, k: int, bw: float, lat: float):
    """One ring all-gather or reduce-scatter of ``nbytes`` (whole tensor) over k boards."""
    if k <= 1:
        return np.zeros_like(np.asarray(nbytes, dtype=float))
    return (k - 1) / k * np.asarray(nbytes, dtype=float) / bw + (k - 1) * lat


def collective_per_layer(model: Model, k: int, beta: int, fmt: str, bw: float, lat: float) -> tuple:
    """(forward, backward) collective seconds of every layer on a 1 x k mesh (module doc)."""
    bpe = bytes_per_element(fmt)
    n = len(model.layers)
    cf, cb = np.zeros(n), np.zeros(n)
    for x, (l, r) in enumerate(zip(model.layers, roles(model))):
        xin = l.in_elems * bpe * beta
        xout = l.out_elems * bpe * beta
        if r == "col":
            cf[x] = cb[x] = collective_s(xin, k, bw, lat)
        elif r == "row" or r == "out":
            cf[x] = cb[x] = collective_s(xout, k, bw, lat)
        elif r == "pair":
            cf[x] = cb[x] = collective_s(xin, k, bw, lat) + collective_s(xout, k, bw, lat)
    return cf, cb


def tp_stage_model(sm: StageModel, model: Model, k: int, fmt: str, bw: float, lat: float) -> StageModel:
    """The stage model of a 1 x k tensor-parallel mesh from the one-board model ``sm``:
    per board, compute / k plus the collectives, weights, stashes, buffers and stage inputs / k."""
    if k == 1:
        return sm
    cf, cb = collective_per_layer(model, k, sm.beta, fmt, bw, lat)
    z = lambda x: np.concatenate([[0.0], np.cumsum(x)])  # noqa: E731
    f = np.diff(sm.PF) / k + cf
    b = np.diff(sm.PB) / k + cb
    return replace(sm, PF=z(f), PB=z(b), PW=sm.PW / k, PA=sm.PA / k, PBUF=sm.PBUF / k, IN=sm.IN / k)


class Resharder:
    """Cached resharding times between stage meshes (planner.reshard.best_transfer, fast)."""

    def __init__(self, cluster, bpe: int, seed: int = 0):
        self.cluster, self.bpe, self.seed = cluster, bpe, seed
        self._cache: dict = {}
        self._nets: dict = {}

    def transfer(self, src_boards, dst_boards, shape, src_layout: str, dst_layout: str):
        """(time_s, directed board pairs the best plan's hops use, bytes moved) of moving a
        (rows, features) tensor from mesh 1 x len(src) to 1 x len(dst)."""
        from .reshard import best_transfer, network_from_cluster
        src_boards, dst_boards = tuple(src_boards), tuple(dst_boards)
        key = (src_boards, dst_boards, tuple(shape), src_layout, dst_layout)
        if key not in self._cache:
            nk = (src_boards, dst_boards)
            if nk not in self._nets:
                self._nets[nk] = network_from_cluster(self.cluster, src_boards, dst_boards)
            res = best_transfer(tuple(shape), self.bpe, (1, len(src_boards)), src_layout, (1, len(dst_boards)),
                                dst_layout, self._nets[nk], seed=self.seed, fast=True)
            pairs = tuple(sorted({(h["src"], h["dst"]) for h in res.hop_records() if h["src"] != h["dst"]}))
            self._cache[key] = (res.time_s, pairs, res.moved_bytes)
        return self._cache[key]
