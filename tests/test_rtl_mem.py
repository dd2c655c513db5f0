"""MVU memory images (codegen/rtl/memories.py): the vectorised layout equals MvuSpec.weight_word
word by word, and the $readmemh text parses back to the same two's-complement values."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bapipe.codegen.rtl.memories import hex_lines, mvu_memory_files, weight_words
from bapipe.codegen.design.dataflow import MvuSpec


def _parse(text: bytes, elem_w: int) -> list[int]:
    vals = [int(line, 16) for line in text.decode().splitlines()]
    return [v - (1 << elem_w) if v >> (elem_w - 1) else v for v in vals]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 3), st.integers(1, 3), st.sampled_from([8, 16]),
       st.integers(0, 2**31))
def test_images_match_weight_word(pe, simd, nf, sf, elem_w, seed):
    rng = np.random.default_rng(seed)
    mh, mw = pe * nf, simd * sf
    lim = 1 << (elem_w - 1)
    w = rng.integers(-lim, lim, (mh, mw))
    b = rng.integers(-lim, lim, mh)
    spec = MvuSpec("m", "l", mw, mh, pe, simd, False, elem_w, elem_w // 2, w, b)
    words = weight_words(spec)
    assert words.shape == (nf * sf, pe * simd) and words.dtype == np.int64
    assert words.tolist() == [spec.weight_word(a) for a in range(spec.cycles_per_vector)]
    files = mvu_memory_files(spec)
    assert sorted(files) == ["m_b.hex", "m_w.hex"]
    assert _parse(files["m_w.hex"], elem_w) == words.reshape(-1).tolist()
    assert _parse(files["m_b.hex"], elem_w) == b.tolist()
    digits = (elem_w + 3) // 4
    assert len(files["m_w.hex"]) == mh * mw * (digits + 1)


def test_hex_lines_extremes():
    assert hex_lines(np.array([0, -1, 32767, -32768, 1]), 16) == b"0000\nffff\n7fff\n8000\n0001\n"
    assert hex_lines(np.array([-128, 127, -1]), 8) == b"80\n7f\nff\n"
