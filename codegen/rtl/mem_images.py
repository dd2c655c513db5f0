"""The MVUs' ``$readmemh`` images, written from the stages' weight images when a tool reads them.

The MVU (hls_templates/rtl/engine/mvu.v.j2) loads ``<module>_w.hex`` / ``<module>_b.hex`` with
``$readmemh`` from the ``BAPIPE_MEM_DIR`` directory: Verilator and yosys read text, one word a
line (codegen.rtl.mem_words). The words themselves are the stage's weight image's bytes
(codegen.design.weight_image: an engine kernel's MVU array is banked exactly as the memory
holds it), so `bapipe gen` does not write them a second time as text (VGG-16's would be
0.9 GB). ``rtl/manifest.json`` says, per image, which array of which stage image it is
(``memories``); :func:`ensure_memories` writes the text next to the RTL the first time a
simulator, synthesiser or packager needs it, and leaves it there (it is a pure function of
the image, which a new gen replaces with the whole folder). The host's weights and the
reference's (``params``) come from the same table (codegen.rtl.pipeline.read_params).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from bapipe.codegen.design.weight_image import banked_words, read_raw, stored_banked
from bapipe.codegen.rtl.mem_words import word_lines

#: memory words converted to text at a time (each PE x SIMD lanes): bounds the memory of fc6-sized images
WORDS_PER_BLOCK = 1 << 14


def memory_table(pipe, entries: dict[tuple[str, str], dict]) -> dict[str, dict]:
    """``{"<module>_w.hex": {...}, "<module>_b.hex": {...}}`` of every MVU of ``pipe``: the
    image array it is read from (``entries[(layer, key)]``, weight_image.Slot.describe) and the
    memory's shape (words of lanes) and the folding the words are laid out for."""
    table = {}
    for st in pipe.stages:
        for b in st.blocks:
            m = b.mvu
            if m is None:
                continue
            hwc = getattr(m.weights, "hwc", None)
            table[f"{m.module}_w.hex"] = {"array": entries[(m.layer, "w")], "words": m.nf * m.sf,
                                          "lanes": m.pe * m.simd, "pe": m.pe, "simd": m.simd,
                                          "hwc": list(hwc) if hwc else None, "elem_w": m.elem_w}
            table[f"{m.module}_b.hex"] = {"array": entries[(m.layer, "b")], "words": m.nf, "lanes": m.pe,
                                          "elem_w": m.elem_w}
    return table


def _blocks(root: Path, spec: dict):
    """One memory's words, a block of WORDS_PER_BLOCK at a time: (words, lanes) raw integers."""
    a, words, lanes = spec["array"], int(spec["words"]), int(spec["lanes"])
    for w0 in range(0, words, WORDS_PER_BLOCK):
        w1 = min(words, w0 + WORDS_PER_BLOCK)
        if "pe" in spec:   # an MVU's weights: NF*SF words of PE*SIMD lanes
            yield np.asarray(banked_words(root, a, int(spec["pe"]), int(spec["simd"]), spec.get("hwc"), (w0, w1)))
        else:              # its bias: b[nf][p], the array's own order
            part = dict(a, offset=int(a["offset"]) + w0 * lanes, elements=(w1 - w0) * lanes)
            yield read_raw(root, part).reshape(w1 - w0, lanes)


def _text(root: Path, spec: dict, out) -> None:
    """Write one memory's ``$readmemh`` text to the open file ``out``, a block of words at a time."""
    for v in _blocks(root, spec):
        out.write(word_lines(v, int(spec["elem_w"])))


#: element widths whose words a simulator can load as raw bytes (``$fread``, BAPIPE_MEM_BIN)
BINARY_ELEM_W = (8, 16)


def _bytes(root: Path, spec: dict, out) -> None:
    """Write one memory as raw bytes to ``out``: word after word, lane 0 first, each element
    big-endian (``$fread`` puts a word's first byte in its top bits), a block at a time."""
    ew = int(spec["elem_w"])
    dtype = {8: ">u1", 16: ">u2"}[ew]
    for v in _blocks(root, spec):
        out.write((v.astype(np.int64) & ((1 << ew) - 1)).astype(dtype).tobytes())


def _build_root(mem_dir: Path, table: dict) -> Path:
    """The build the images' paths are relative to: ``rtl/``'s parent for the board RTL, further
    up for a stage bench (``rtl/stages/s<i>``): the nearest folder above ``mem_dir`` that holds
    the first image the table reads (the bench's own folder otherwise, which then fails to read)."""
    files = sorted({spec["array"]["file"] for spec in table.values()})
    for root in mem_dir.resolve().parents:
        if not files or (root / files[0]).is_file():
            return root
    return mem_dir.parent


#: Verilog's $fseek takes a 32-bit signed offset: a slice further into an image gets its own file
MAX_SEEK = (1 << 31) - 1


def image_slice(root: Path, spec: dict) -> tuple[Path, int] | None:
    """(stage image, byte offset) when an MVU's weight memory is a plain slice of its stage's
    image that the MVU can ``$fread`` itself (words stored as the memory holds them, little-endian
    whole-byte elements, within $fseek's reach): the image is read in place, no copy is written.
    None otherwise (a ``<module>_w.bin`` of its own)."""
    a = spec["array"]
    if "pe" not in spec or int(spec["elem_w"]) not in BINARY_ELEM_W \
            or not stored_banked(a, int(spec["pe"]), int(spec["simd"]), spec.get("hwc")):
        return None
    dt = np.dtype(a["dtype"])
    if dt.itemsize * 8 != int(spec["elem_w"]) or dt.byteorder == ">":
        return None
    seek = int(a["offset"]) * dt.itemsize
    return ((root / a["file"]).resolve(), seek) if seek <= MAX_SEEK else None


def _table(mem_dir: Path) -> tuple[dict, Path] | None:
    """The manifest's memories and the build they are read from, or None (no manifest)."""
    if not (mem_dir / "manifest.json").is_file():
        return None
    man = json.loads((mem_dir / "manifest.json").read_text(encoding="utf-8"))
    table = man.get("memories") or {}
    return table, _build_root(mem_dir, table)


def image_plusargs(mem_dir: Path) -> list[str]:
    """The simulator's ``+<module>_w_image=PATH +<module>_w_seek=BYTES`` arguments: the MVUs whose
    weights are read in place from the stage images (:func:`image_slice`; mvu.v.j2 under
    BAPIPE_MEM_BIN)."""
    found = _table(Path(mem_dir))
    if found is None:
        return []
    table, root = found
    args = []
    for name in sorted(table):
        where = image_slice(root, table[name])
        if where is not None:
            module = name[:-len("_w.hex")]
            args += [f"+{module}_w_image={where[0]}", f"+{module}_w_seek={where[1]}"]
    return args


def ensure_memories(mem_dir: Path, binary: bool = False) -> list[Path]:
    """Write the ``$readmemh`` images ``mem_dir/manifest.json`` lists that are not there yet
    (each through a temporary file, so an interrupted write leaves none half-written); returns
    every image's path. ``binary``: the weight memories as ``<module>_w.bin`` raw bytes instead
    (what the MVU reads with ``$fread`` under BAPIPE_MEM_BIN; biases stay text), none for a memory
    read in place from its stage image (:func:`image_slice`). A manifest without ``memories`` (the
    images were written with the RTL) needs nothing."""
    mem_dir = Path(mem_dir)
    found = _table(mem_dir)
    if found is None:
        return []
    table, root = found
    paths = []
    for name in sorted(table):
        raw = binary and "pe" in table[name]
        if raw and image_slice(root, table[name]) is not None:
            continue
        path = mem_dir / (name[:-len(".hex")] + ".bin" if raw else name)
        paths.append(path)
        if path.exists():
            continue
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            with tmp.open("wb") as f:
                (_bytes if raw else _text)(root, table[name], f)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
    return paths
