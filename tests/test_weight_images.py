"""The RTL simulation reads an MVU's weights from the stage's one weight image, in place: the
slice it seeks to, with each little-endian element's bytes swapped (mvu.v.j2 under
BAPIPE_MEM_BIN), is byte for byte the big-endian ``<module>_w.bin`` it used to be given
(codegen.rtl.mem_images); where a memory is not a plain slice, it still gets that file."""
from __future__ import annotations

import io
import json

import numpy as np

import handplan
from bapipe.codegen.rtl import mem_images
from bapipe.codegen.rtl.mem_images import MAX_SEEK, image_plusargs, image_slice
from bapipe.codegen.rtl.write import render_rtl
from bapipe.fpga_models.plancheck import resolve


def _build(tmp_path):
    plan = handplan.tiny_mlp_plan(3)
    model, cluster = resolve(plan)
    render_rtl(plan, model, cluster, tmp_path)
    table = json.loads((tmp_path / "rtl" / "manifest.json").read_text())["memories"]
    return tmp_path, {n: s for n, s in table.items() if n.endswith("_w.hex")}


def test_the_slice_swapped_is_the_big_endian_image(tmp_path):
    root, weights = _build(tmp_path)
    assert weights
    for name, spec in weights.items():
        path, seek = image_slice(root, spec)
        n = int(spec["words"]) * int(spec["lanes"]) * int(spec["elem_w"]) // 8
        with open(path, "rb") as f:
            f.seek(seek)
            raw = f.read(n)
        swapped = np.frombuffer(raw, dtype="<u2").astype(">u2").tobytes()
        want = io.BytesIO()
        mem_images._bytes(root, spec, want)
        assert swapped == want.getvalue(), name


def test_plusargs_name_every_slice_and_no_copy_is_written(tmp_path):
    root, weights = _build(tmp_path)
    args = image_plusargs(root / "rtl")
    assert len(args) == 2 * len(weights)
    for name, spec in weights.items():
        module = name[:-len("_w.hex")]
        path, seek = image_slice(root, spec)
        assert f"+{module}_w_image={path}" in args and f"+{module}_w_seek={seek}" in args
    written = mem_images.ensure_memories(root / "rtl", binary=True)
    assert written and not [p for p in written if p.name.endswith("_w.bin")]   # only the biases' text


def test_memories_that_are_not_a_plain_slice_get_their_own_file(tmp_path):
    root, weights = _build(tmp_path)
    spec = next(iter(weights.values()))
    kernel = dict(spec, array=dict(spec["array"], layout="kernel"))
    far = dict(spec, array=dict(spec["array"], offset=MAX_SEEK // 2 + 1))   # 2-byte elements: past $fseek's reach
    refolded = dict(spec, pe=int(spec["pe"]) * 2 if int(spec["pe"]) * 2 <= int(spec["lanes"]) else 1)
    assert image_slice(root, kernel) is None and image_slice(root, far) is None
    assert image_slice(root, refolded) is None
