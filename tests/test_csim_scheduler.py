"""bapipe_csim.h's scheduler (docs/codegen.md, "Bounded C-simulation"): DATAFLOW processes are
coroutines of one thread. What a thread per process gave for free must still hold: a library
function's whole-tensor buffer is each process's own, a process that polls a stream lets the
others run, and a deadlock names every blocked process once, in the order they blocked."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.csim

_COMMON = ("bapipe_types.h", "bapipe_layers.h", "bapipe_csim.h")


def _build(tmp_path: Path, body: str, name: str) -> Path:
    """``body`` (C++ after the library includes) compiled as csim compiles a kernel."""
    from bapipe.codegen.check.cxx_run import compile_sources
    from bapipe.codegen.design.context import format_ctx
    from bapipe.codegen.hls.project import environment

    env, fctx, hdr = environment(), format_ctx("fixed16"), "// test_csim_scheduler"
    common = tmp_path / "common"
    (common / "csim").mkdir(parents=True)
    for f in _COMMON:
        (common / f).write_text(env.get_template(f + ".j2").render(fmt=fctx, header=hdr))
    (common / "csim" / "hls_stream.h").write_text(env.get_template("hls_stream_csim.h.j2").render(fmt=fctx, header=hdr))
    src = tmp_path / f"{name}.cpp"
    src.write_text('#include <cstdio>\n#include "bapipe_layers.h"\n' + body)
    return compile_sources([src], [common], tmp_path / "cache", name).path


def _run(binary: Path, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([str(binary)], input=stdin, capture_output=True, text=True, timeout=60)


def test_two_processes_of_one_library_template_keep_their_own_buffers(tmp_path):
    """Two maxpool processes with the same template arguments (one static buffer under Vitis,
    one per call site) on different images, their outputs read in turns through depth-2
    streams: each blocks after two outputs with its image half pooled while the other reads
    its own image in. The results are numpy's pooling of each image."""
    c, h, w = 2, 4, 4
    body = """
static void take_turns(hls::stream<data_t> &a, hls::stream<data_t> &b, data_t *out, int n) {
    for (int i = 0; i < n; i++) {
        out[2 * i] = a.read();
        out[2 * i + 1] = b.read();
    }
}

int main() {
    hls::stream<data_t> ia("ia"), ib("ib");
    hls::stream<data_t, 2> oa("oa"), ob("ob");
    static data_t out[16];
    for (int i = 0; i < 64; i++) {
        int v;
        if (std::scanf("%d", &v) != 1) return 3;
        data_t d;
        d.V = v;
        (i < 32 ? ia : ib).write(d);   // image a, then image b (HWC)
    }
    BAPIPE_DATAFLOW_BEGIN
    BAPIPE_PROCESS(bapipe::maxpool<2, 4, 4, 2, 2, 2, 2, 0, 0, 1>(ia, oa));
    BAPIPE_PROCESS(bapipe::maxpool<2, 4, 4, 2, 2, 2, 2, 0, 0, 1>(ib, ob));
    BAPIPE_PROCESS(take_turns(oa, ob, out, 8));
    BAPIPE_DATAFLOW_END
    for (int i = 0; i < 16; i++) std::printf("%d\\n", (int)out[i].V.to_int64());
    return 0;
}
"""
    binary = _build(tmp_path, body, "two_pools")
    rng = np.random.default_rng(3)
    imgs = rng.integers(-2048, 2048, size=(2, h, w, c))          # HWC, raw values
    r = _run(binary, "\n".join(map(str, imgs.reshape(-1).tolist())) + "\n")
    assert r.returncode == 0, r.stderr
    got = np.array(r.stdout.split(), dtype=np.int64).reshape(8, 2)   # (output beat, image)
    want = imgs.reshape(2, h // 2, 2, w // 2, 2, c).max(axis=(2, 4)).reshape(2, -1)
    assert (got.T == want).all(), (got.T, want)


def test_a_process_that_polls_lets_the_others_run(tmp_path):
    """A consumer that spins on empty() before each read (legal C++, no HLS idiom of ours):
    on one thread it must hand over to the producer instead of spinning for ever."""
    body = """
static void produce(hls::stream<data_t> &s, int n) {
    for (int i = 0; i < n; i++) {
        data_t d;
        d.V = i;
        s.write(d);
    }
}

static void consume(hls::stream<data_t> &s, long *sum, int n) {
    for (int i = 0; i < n; i++) {
        while (s.empty()) {
        }
        data_t d;
        while (!s.read_nb(d)) {
        }
        *sum += d.V.to_int64();
    }
}

int main() {
    hls::stream<data_t, 2> s("s");
    long sum = 0;
    BAPIPE_DATAFLOW_BEGIN
    BAPIPE_PROCESS(consume(s, &sum, 100));
    BAPIPE_PROCESS(produce(s, 100));
    BAPIPE_DATAFLOW_END
    std::printf("%ld\\n", sum);
    return 0;
}
"""
    r = _run(_build(tmp_path, body, "poll"))
    assert r.returncode == 0 and r.stdout.split() == [str(sum(range(100)))], (r.returncode, r.stdout, r.stderr)


def test_a_deadlock_names_each_blocked_process_once_in_the_order_they_blocked(tmp_path):
    """A writer fills its depth-2 stream that no one reads while the reader waits on another
    stream that no one writes: exit 86, one line, the reader (it blocked first: processes run
    in the order they were spawned) then the writer; the region's parent (joining) is not
    listed."""
    body = """
static void reader(hls::stream<data_t> &in, hls::stream<data_t> &out) { out.write(in.read()); }

static void writer(hls::stream<data_t> &out) {
    for (int i = 0; i < 3; i++) out.write(data_t(0));
}

int main() {
    hls::stream<data_t, 2> never("never"), full("full"), sink("sink");
    BAPIPE_DATAFLOW_BEGIN
    BAPIPE_PROCESS(reader(never, sink));
    BAPIPE_PROCESS(writer(full));
    BAPIPE_DATAFLOW_END
    return 0;
}
"""
    r = _run(_build(tmp_path, body, "stuck"))
    assert r.returncode == 86, (r.returncode, r.stderr)
    assert r.stderr.splitlines() == [
        "BAPIPE_DEADLOCK: every process is blocked: kernel main/reader(never, sink): stream never empty (0/2); "
        "kernel main/writer(full): stream full full (2/2);"], r.stderr
