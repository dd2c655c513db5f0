"""A stage's weight image: one binary file per stage, ``stage<i>/weights.bin``, that every
reader takes the stage's weights from (docs/codegen.md, "Where the weights live").

The image holds the stage's arrays as its forward kernel reads them, raw little-endian
integers of the format's width (int16; int8 for 8-bit formats), one after the other:

- an engine kernel (codegen.design.tm_kernel): its arrays in the kernel's order, each MVU's
  weights banked ``w[nf*SF + sf][p][s] = W[nf*PE + p][sf*SIMD + s]`` (what its m_axi argument,
  the RTL MVU's memory and the host's device buffer hold), biases ``b[nf][p]`` and batchnorm
  scale/shift in channel order;
- a per-layer kernel (no engine): each layer's arrays in kernel layout (dense ``W[out][in]``,
  conv2d the MVU matrix ``W[o][(ky*KW + kx)*C + c]``), in layer order.

Each array is a :class:`Slot`; its description (``Slot.describe``: file, offset, layout, the
folding a banked array was laid out with) goes into host_config.json and rtl/manifest.json,
and :func:`read_model` / :func:`banked_words` turn any described array back into the model's
layout or into an MVU's memory words. So the HLS testbenches, the C-simulation's numpy
reference, the xrt host, the RTL's ``$readmemh`` images (written from it when a simulator or
synthesiser needs them, codegen.rtl.mem_images) and `bapipe rtlsim`'s reference all read the
same bytes, and no second copy of the weights is written.

The image is written a block at a time (:func:`write_image`): VGG-16's second stage holds
137 M weights, and its arrays are computed from the model-layout weights as they are written
(codegen.design.weight_layout).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bapipe.codegen.design.weight_layout import Banked, MvuMatrix, flat_blocks, flatten_perm

#: the stage's image, relative to the build
IMAGE = "weights.bin"


def image_path(stage_name: str) -> str:
    """``stage<i>/weights.bin``: the image of the stage kernel ``stage_name``."""
    return f"{stage_name}/{IMAGE}"


def raw_dtype(width: int) -> np.dtype:
    """The image's element type for a format of ``width`` bits."""
    return np.dtype("<i2") if width > 8 else np.dtype("i1")


@dataclass
class Slot:
    """One array of a stage's image."""

    name: str                      # the layer's weight array (codegen.design.context.WeightArray name)
    layer: str
    key: str                       # w, b (dense/conv2d), scale, shift (batchnorm)
    values: Any                    # ndarray, or weight_layout.Banked / MvuMatrix (built when written)
    model_shape: tuple[int, ...]
    layout: str = "kernel"         # "kernel": the kernel-layout array in C order; "banked": an MVU's w[nf*SF+sf][p][s]
    rows: int = 0                  # kernel-layout matrix (dense, conv2d w): rows x cols
    cols: int = 0
    pe: int = 0                    # banked: the folding it is laid out for
    simd: int = 0
    hwc: tuple[int, int, int] | None = None   # banked: W's columns in the HWC order of this flattened image
    offset: int = 0                # elements of the image before it
    rom: str = ""                  # the engine kernel's array holding it (its Design node's name), if any

    @property
    def elements(self) -> int:
        return int(np.prod(self.model_shape)) if self.model_shape else 1

    def describe(self, file: str, dtype: np.dtype) -> dict:
        """What a reader needs to find and unfold it (JSON)."""
        d = {"name": self.name, "rom": self.rom or None, "layer": self.layer, "key": self.key, "file": file,
             "dtype": dtype.str,
             "offset": self.offset, "elements": self.elements, "shape": list(self.model_shape),
             "layout": self.layout, "rows": self.rows, "cols": self.cols}
        if self.layout == "banked":
            d.update({"pe": self.pe, "simd": self.simd, "hwc": list(self.hwc) if self.hwc else None})
        return d


def _matrix_dims(model_shape) -> tuple[int, int]:
    """(rows, cols) of an array's kernel layout: a matrix for dense/conv2d weights, else one row."""
    if len(model_shape) >= 2:
        return int(model_shape[0]), int(np.prod(model_shape[1:]))
    return 1, int(np.prod(model_shape)) if model_shape else 1


def _key(weight_name: str) -> str:
    return weight_name.rsplit("_", 1)[1]


def stage_slots(sc) -> list[Slot]:
    """The image of a generated stage (codegen.design.context.StageCtx), offsets set: an engine
    kernel's arrays (every ROM, in its order) or a per-layer kernel's (its weight arrays)."""
    from bapipe.names import legal

    by_rom: dict[str, tuple] = {}
    for lc in sc.layers:
        for w in lc.weights:
            key = _key(w.name)
            # the engine node names of codegen.design.dataflow: s<i>_<layer>_mvu_<w|b>, s<i>_<layer>_<scale|shift>
            by_rom[f"s{sc.index}_{legal(lc.name)}_mvu_{key}"] = (lc, w, key)
            by_rom.setdefault(f"s{sc.index}_{legal(lc.name)}_{key}", (lc, w, key))
    slots: list[Slot] = []
    if sc.engine is not None:
        for r in sc.engine.roms:
            if r.buffer:
                continue
            if r.name not in by_rom:
                raise ValueError(f"stage {sc.index}: engine array {r.name} is no layer's weights")
            lc, w, key = by_rom[r.name]
            rows, cols = _matrix_dims(w.model_shape)
            if isinstance(r.values, Banked):
                b = r.values
                slots.append(Slot(w.name, lc.name, key, b, tuple(w.model_shape), "banked", rows, cols,
                                  b.pe, b.simd, b.matrix.hwc, rom=r.name))
            else:
                slots.append(Slot(w.name, lc.name, key, r.values, tuple(w.model_shape), "kernel", rows, cols,
                                  rom=r.name))
    else:
        for lc in sc.layers:
            for w in lc.weights:
                rows, cols = _matrix_dims(w.model_shape)
                slots.append(Slot(w.name, lc.name, _key(w.name), w.kernel_q, tuple(w.model_shape), "kernel",
                                  rows, cols))
    return _placed(slots)


def pipeline_slots(pipe) -> dict[int, list[Slot]]:
    """The images of an RTL-only lowering (no HLS stage contexts: render_rtl), per stage
    index: each MVU's weights banked for its folding and its bias, each batchnorm's scale and
    shift, in block order."""
    from bapipe.names import legal

    ops = {f"s{st.index}_{legal(op['layer'])}": op for st in pipe.stages for op in pipe.ops}
    out: dict[int, list[Slot]] = {}
    for st in pipe.stages:
        slots = out.setdefault(st.index, [])
        for b in st.blocks:
            if b.mvu is not None:
                m = b.mvu
                mat = m.weights if isinstance(m.weights, MvuMatrix) else MvuMatrix(np.asarray(m.weights))
                shape = tuple(mat.model.shape)
                slots.append(Slot(f"{legal(m.layer)}_w", m.layer, "w", Banked(mat, m.pe, m.simd), shape, "banked",
                                  m.mh, m.mw, m.pe, m.simd, mat.hwc, rom=f"{b.inst}_w"))
                slots.append(Slot(f"{legal(m.layer)}_b", m.layer, "b", np.asarray(m.bias), (m.mh,), "kernel", 1,
                                  m.mh, rom=f"{b.inst}_b"))
            elif b.kind == "bn":
                op = ops.get(b.inst)
                if op is None or "scale" not in op:
                    continue
                for key in ("scale", "shift"):
                    v = np.asarray(op[key])
                    slots.append(Slot(f"{legal(op['layer'])}_{key}", op["layer"], key, v, tuple(v.shape), "kernel",
                                      1, v.size, rom=f"{b.inst}_{key}"))
    return {k: _placed(v) for k, v in out.items()}


def _placed(slots: list[Slot]) -> list[Slot]:
    off = 0
    for s in slots:
        s.offset = off
        off += s.elements
    return slots


def write_image(path: Path, slots: list[Slot], width: int) -> Path:
    """Write the image, a block at a time (no array is built whole); returns ``path``."""
    dt = raw_dtype(width)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        for s in slots:
            n = 0
            for block in flat_blocks(s.values):
                f.write(block.astype(dt).tobytes())
                n += block.size
            if n != s.elements:
                raise ValueError(f"{path}: {s.name} holds {n} elements, expected {s.elements}")
    return path


# --- reading ---------------------------------------------------------------------------------


def read_raw(root: Path, entry: dict) -> np.ndarray:
    """The array's raw elements as stored (int64, flat), read from its image under ``root``."""
    path = Path(root) / entry["file"]
    dt = np.dtype(entry["dtype"])
    with path.open("rb") as f:
        f.seek(int(entry["offset"]) * dt.itemsize)
        a = np.fromfile(f, dtype=dt, count=int(entry["elements"]))
    if a.size != int(entry["elements"]):
        raise ValueError(f"{path} holds fewer elements than {entry['name']} needs")
    return a.astype(np.int64)


def _kernel_from_banked(flat: np.ndarray, entry: dict) -> np.ndarray:
    """A banked MVU array -> its kernel-layout matrix (rows, cols)."""
    rows, cols, pe, simd = (int(entry[k]) for k in ("rows", "cols", "pe", "simd"))
    w = flat.reshape(rows // pe, cols // simd, pe, simd).transpose(0, 2, 1, 3).reshape(rows, cols)
    if entry.get("hwc"):   # W[:, j] = K[:, perm[j]]
        k = np.empty_like(w)
        k[:, flatten_perm(*entry["hwc"])] = w
        return k
    return w


def kernel_layout(flat: np.ndarray, entry: dict) -> np.ndarray:
    """Stored elements -> the kernel-layout array (matrix for dense/conv2d weights, else flat)."""
    if entry["layout"] == "banked":
        return _kernel_from_banked(flat, entry)
    if len(entry["shape"]) >= 2:
        return flat.reshape(int(entry["rows"]), int(entry["cols"]))
    return flat


def to_model(kernel: np.ndarray, shape) -> np.ndarray:
    """Kernel layout -> model layout (conv2d: (O, kh*kw*C) -> OIHW)."""
    shape = tuple(int(x) for x in shape)
    if len(shape) == 4:
        o, c, kh, kw = shape
        return np.asarray(kernel).reshape(o, kh, kw, c).transpose(0, 3, 1, 2)
    return np.asarray(kernel).reshape(shape)


def read_model(root: Path, entry: dict) -> np.ndarray:
    """One described array in the model's layout (int64)."""
    return to_model(kernel_layout(read_raw(root, entry), entry), entry["shape"])


def read_layers(root: Path, entries: list[dict]) -> dict[str, dict[str, np.ndarray]]:
    """{layer: {key: model-layout int64 array}} of described arrays."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for e in entries:
        out.setdefault(e["layer"], {})[e["key"]] = read_model(root, e)
    return out


def stored_banked(entry: dict, pe: int, simd: int, hwc=None) -> bool:
    """Whether the described array holds an MVU's weight memory word after word as it is (banked
    for this PE x SIMD folding and input order): its words are then a plain slice of the image."""
    return entry["layout"] == "banked" and (int(entry["pe"]), int(entry["simd"])) == (pe, simd) \
        and (entry.get("hwc") or None) == (list(hwc) if hwc else None)


def banked_words(root: Path, entry: dict, pe: int, simd: int, hwc=None, words: tuple[int, int] | None = None
                 ) -> np.ndarray:
    """An MVU's weight memory (NF*SF words of PE*SIMD lanes, int64), or the words ``words``
    = (first, end) of it, from a described array: read as stored when it is banked for this
    folding, else rebuilt from its kernel layout."""
    rows, cols = int(entry["rows"]), int(entry["cols"])
    lanes, nwords = pe * simd, rows * cols // (pe * simd)
    w0, w1 = words if words is not None else (0, nwords)
    if stored_banked(entry, pe, simd, hwc):
        part = dict(entry, offset=int(entry["offset"]) + w0 * lanes, elements=(w1 - w0) * lanes)
        return read_raw(root, part).reshape(w1 - w0, lanes)
    k = kernel_layout(read_raw(root, entry), entry)
    w = k[:, flatten_perm(*hwc)] if hwc else k
    b = w.reshape(rows // pe, pe, cols // simd, simd).transpose(0, 2, 1, 3).reshape(nwords, lanes)
    return b[w0:w1]


def file_digest(path: Path) -> str:
    """sha256 of a file (hex), read a block at a time."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
