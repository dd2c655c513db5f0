"""How the MVU's memories are declared and read: storage per memory, and images one word a line.

The MVU (hls_templates/rtl/engine/mvu.v.j2) reads each memory through one synchronous port
of a whole word, so that a synthesiser infers a RAM primitive rather than a multiplexer tree
(AMD UG901, "RAM HDL Coding Techniques"). ``$readmemh`` loads one word per whitespace-separated
number, so the images hold one word per line: the weight word ``a = nf*SF + sf`` (PE x SIMD
elements, lane ``p*SIMD + i`` = W[nf*PE+p][sf*SIMD+i]) and the bias word ``nf`` (PE elements),
lane 0 in the leftmost digits. The element order is that of ``codegen.rtl.memories`` (the
same reshuffle, ``memories._layout``); only the line breaks differ: a line is the
concatenation of a word's element lines.

Storage (the ``ram_style`` each memory is declared with; yosys and Vivado both honour it,
UG901 "ram_style"):

- ROMs (weights, biases) of at most ``kernel_types.LUTRAM_WORDS`` words: LUTs, the rule the
  HLS kernels' ROMs follow (codegen.design.tm_kernel._rom_impl: LUTRAM). A distributed ROM
  is a LUT per bit per 64 words (AMD UG574, "Distributed RAM": ROM64X1 is one LUT6), which
  is what ``ram_style = "logic"`` gives (yosys has no LUTRAM mapping for a memory without
  a write port); a single word is a constant. Deeper ROMs: block RAM. Never UltraRAM: a URAM288 has no
  initial contents (AMD UG573, "UltraRAM": no INIT attributes), so a ROM cannot be one.
- the input buffer (SF words, written by the unit): distributed up to LUTRAM_WORDS words,
  else block RAM.
"""
from __future__ import annotations

import numpy as np

from bapipe.codegen.design.dataflow import MvuSpec
from bapipe.codegen.design.kernel_types import LUTRAM_WORDS
from bapipe.codegen.rtl.memories import _layout, _line_table
from bapipe.fpga_models.engines import MVU_TREE_FANIN, mvu_fill, mvu_tree_stages


def rom_style(words: int) -> str:
    """``ram_style`` of a ROM of ``words`` words (module docstring)."""
    return "logic" if words <= LUTRAM_WORDS else "block"


def buffer_style(words: int) -> str:
    """``ram_style`` of a buffer the unit writes, ``words`` deep."""
    return "distributed" if words <= LUTRAM_WORDS else "block"


def word_lines(values: np.ndarray, elem_w: int) -> bytes:
    """``$readmemh`` text of a (words, lanes) array: one line per word, lane 0 leftmost, each
    element ceil(elem_w/4) hex digits of its two's complement."""
    if not 1 <= elem_w <= 16:
        raise ValueError(f"elem_w {elem_w}: expected 1..16 bits")
    v = np.asarray(values)
    words, lanes = v.shape
    digits = (elem_w + 3) // 4
    raw = (v.astype(np.int64) & ((1 << elem_w) - 1)).astype(np.uint16)
    text = np.empty((words, lanes * digits + 1), dtype=np.uint8)
    text[:, :-1] = _line_table(elem_w)[raw][:, :, :digits].reshape(words, lanes * digits)
    text[:, -1] = ord("\n")
    return text.tobytes()


def mvu_word_files(spec: MvuSpec) -> dict[str, bytes]:
    """``{"<module>_w.hex": ..., "<module>_b.hex": ...}``: the MVU's images, one word a line."""
    w = np.asarray(spec.weights)
    if w.shape != (spec.mh, spec.mw):
        raise ValueError(f"weights of {spec.module}: expected shape {(spec.mh, spec.mw)}, got {w.shape}")
    b = np.asarray(spec.bias).reshape(-1)
    if b.shape != (spec.mh,):
        raise ValueError(f"bias of {spec.module}: expected {spec.mh} values, got {b.size}")
    if not np.issubdtype(w.dtype, np.integer):
        w = w.astype(np.int64)
    raw = w.astype(np.uint16) & np.uint16((1 << spec.elem_w) - 1)
    return {f"{spec.module}_w.hex": word_lines(_layout(raw, spec), spec.elem_w),
            f"{spec.module}_b.hex": word_lines(np.asarray(b, dtype=np.int64).reshape(spec.nf, spec.pe), spec.elem_w)}


def tree_stages(simd: int) -> list[dict]:
    """The adder tree's registered stages: ``{k, n_in, n_out}`` terms per PE, k from 1, with
    ``full`` groups of MVU_TREE_FANIN terms and the ``rest`` (the last group's term indices,
    when n_in is not a multiple of the fan-in)."""
    out, n = [], max(1, simd)
    for k in range(1, mvu_tree_stages(simd) + 1):
        m = -(-n // MVU_TREE_FANIN)
        full = n // MVU_TREE_FANIN
        out.append({"k": k, "n_in": n, "n_out": m, "full": full, "rest": list(range(full * MVU_TREE_FANIN, n))})
        n = m
    return out


def pe_module(simd: int) -> str:
    """Module (and file) name of the MVU processing element with ``simd`` lanes
    (hls_templates/rtl/engine/mvu_pe.v.j2): one per SIMD width, shared by every MVU of it."""
    return f"mvu_pe_s{int(simd)}"


def mvu_memory_params(spec: MvuSpec) -> dict:
    """Template parameters of the MVU's memories, tree and output queue."""
    from bapipe.codegen.design.dataflow import clog2

    fill = mvu_fill(spec.simd)
    stages = tree_stages(spec.simd)
    oq_depth = fill + 2    # owed outputs in flight at one per cycle (SF = 1): fill + 1, plus one spare
    return {"w_style": rom_style(spec.nf * spec.sf), "b_style": rom_style(spec.nf),
            "i_style": buffer_style(spec.sf), "fanin": MVU_TREE_FANIN, "stages": stages,
            "tree_stages": len(stages), "last_t": len(stages), "fill": fill, "pe_module": pe_module(spec.simd),
            "oq_depth": oq_depth, "oq_w": clog2(oq_depth)}
