"""Memory-initialisation files of the generated matrix-vector units.

``hls_templates/rtl/mvu.v.j2`` keeps its weights and biases out of the Verilog: it loads
``<module>_w.hex`` and ``<module>_b.hex`` with ``$readmemh`` (directory from the
``BAPIPE_MEM_DIR`` macro). This module lays the numbers out the way the template reads them
and writes the files' bytes, vectorised, because VGG-16's fc6 alone has 102.8M weights.

Layout (the template's header says the same): weight word ``a = nf*SF + sf`` holds
W[nf*PE+p][sf*SIMD+i] in lane ``p*SIMD+i``, and the weight file lists words in address order,
lanes in order within a word, one two's-complement element of ceil(ELEM_W/4) lowercase hex
digits per line. The bias file lists b[0..MH-1].
"""
from __future__ import annotations

import numpy as np

from bapipe.codegen.design.dataflow import MvuSpec

_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_TABLES: dict[int, np.ndarray] = {}


def _layout(w: np.ndarray, spec: MvuSpec) -> np.ndarray:
    """(MH, MW) matrix -> (NF*SF, PE*SIMD) words in any dtype (a view-free reshuffle)."""
    return (w.reshape(spec.nf, spec.pe, spec.sf, spec.simd).transpose(0, 2, 1, 3)
            .reshape(spec.nf * spec.sf, spec.pe * spec.simd))


def weight_words(spec: MvuSpec) -> np.ndarray:
    """All weight words as an int64 array (NF*SF, PE*SIMD): row a is ``spec.weight_word(a)``."""
    w = np.asarray(spec.weights, dtype=np.int64)
    if w.shape != (spec.mh, spec.mw):
        raise ValueError(f"weights of {spec.module}: expected shape {(spec.mh, spec.mw)}, got {w.shape}")
    return _layout(w, spec)


def _line_table(elem_w: int) -> np.ndarray:
    """(2^elem_w, digits+1) uint8: the text line (hex digits and a newline) of every raw value."""
    if elem_w not in _TABLES:
        digits = (elem_w + 3) // 4
        v = np.arange(1 << elem_w, dtype=np.int64)
        t = np.empty((1 << elem_w, digits + 1), dtype=np.uint8)
        for k in range(digits):
            t[:, k] = _HEX[(v >> (4 * (digits - 1 - k))) & 15]
        t[:, digits] = ord("\n")
        _TABLES[elem_w] = t
    return _TABLES[elem_w]


def hex_lines(values: np.ndarray, elem_w: int) -> bytes:
    """``$readmemh`` text of ``values`` (any shape, read in C order): one element per line,
    two's complement in ``elem_w`` bits, ceil(elem_w/4) lowercase hex digits."""
    if not 1 <= elem_w <= 16:
        raise ValueError(f"elem_w {elem_w}: expected 1..16 bits")
    raw = (np.asarray(values).reshape(-1) & ((1 << elem_w) - 1)).astype(np.uint16)
    return _line_table(elem_w)[raw].tobytes()


def mvu_memory_files(spec: MvuSpec) -> dict[str, bytes]:
    """``{"<module>_w.hex": ..., "<module>_b.hex": ...}``: the bytes the MVU's $readmemh loads."""
    w = np.asarray(spec.weights)
    if w.shape != (spec.mh, spec.mw):
        raise ValueError(f"weights of {spec.module}: expected shape {(spec.mh, spec.mw)}, got {w.shape}")
    b = np.asarray(spec.bias).reshape(-1)
    if b.shape != (spec.mh,):
        raise ValueError(f"bias of {spec.module}: expected {spec.mh} values, got {b.size}")
    if not np.issubdtype(w.dtype, np.integer):
        w = w.astype(np.int64)
    # Narrow to uint16 before the reshuffle (a quarter of the int64 traffic on fc6-sized
    # layers); the integer cast wraps modulo 2^16, i.e. keeps the two's-complement low bits.
    raw = w.astype(np.uint16) & np.uint16((1 << spec.elem_w) - 1)
    return {f"{spec.module}_w.hex": hex_lines(_layout(raw, spec), spec.elem_w),
            f"{spec.module}_b.hex": hex_lines(b, spec.elem_w)}
