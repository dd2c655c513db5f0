"""Hardware engines: the one home of what each engine costs.

Every engine the generators build is described here once: its legal foldings, its cycles
per sample, its fill (turn overhead), its DSP/LUT and its buffers. The planner prices
layers with these (through ``fpga_models.cost`` and ``fpga_models.allocate``), the RTL
lowering (``codegen.design.dataflow``) sizes its blocks and predicts its timing with the same
functions, and ``bapipe rtlsim`` sets the plan against what Verilator measures. If a number
below is wrong, the plan and the hardware are wrong together, and the per-stage agreement
report shows it.

Engines (FINN's streaming dataflow style, Umuroglu et al. FPGA'17, Blott et al. TRETS'18):

- ``mvu`` matrix-vector unit: PE output rows x SIMD input lanes over an MH x MW matrix,
  NF*SF cycles per vector (NF = MH/PE, SF = MW/SIMD), one vector per output pixel;
- ``swg`` sliding-window generator: line buffers of K rows, max(image beats, window beats)
  cycles per image;
- ``pool`` window reduction (max/avg; global average pool is one H x W window): one cycle
  per window beat;
- ``elementwise`` (relu, gelu, ...), ``norm`` (batchnorm, layernorm), ``add`` (residual
  join), ``fork``: ``lanes`` elements per cycle, one beat per cycle;
- ``width_conv``: repacks lanes, max(input beats, output beats) cycles;
- ``concat`` (channel or axis join of two streams, SqueezeNet's Fire), ``mul`` (product of two
  activations; squeeze-excite's per-channel scale is read first, then the image streams by),
  and the activations ``sigmoid`` (piecewise linear, shifts and adds), ``silu`` (x times it),
  ``clip`` (ReLU6): ``lanes`` output elements per cycle; a grouped or depthwise conv2d is an
  MVU over MH = out_channels, MW = (C / groups) * kh * kw whose SIMD lanes read the window
  columns of the output channel's group (PE | MH, SIMD | MW, as any MVU);
- ``fifo``: one beat per cycle;
- ``link``: the board-to-board transport: a sample's words packed into 512-bit beats behind a
  32-bit framing header, beats of 64 bytes at bw bytes per cycle (max(1, 64/bw) cycles a beat),
  credits and window from the round trip (``link_*`` below).

Element-wise engines carry an explicit ``lanes``; matrix engines ``pe`` and ``simd``.
"""
from __future__ import annotations

import math

import numpy as np

#: layer types computed on a matrix-vector unit (PE x SIMD folding)
MVU_TYPES = frozenset({"conv2d", "dense", "lstm", "attention", "additive_attention", "matmul"})
#: layer types reduced over windows by a pool engine (after a window generator, except global)
POOL_TYPES = frozenset({"maxpool", "avgpool", "globalavgpool"})
#: LUTs per MAC lane of an MVU (adder tree + accumulator, fixed point) [estimate, FINN-R Table 2 order]
LUT_PER_MAC = 24
#: LUTs per elementwise lane and per op of work per element [estimate]
LUT_PER_LANE_OP = 40
#: fixed LUT overhead of one layer's engine (control, FIFOs, AXI-Stream glue) [estimate]
LUT_PER_LAYER = 1500
#: widest elementwise stream (256 lanes x 16 bit = 4096-bit AXI-Stream) [design choice]
MAX_LANES = 256

# Fill and turn overheads of the generated RTL (hls_templates/rtl), measured in Verilator by
# cocotb_tests (test_mvu, test_pool, test_tm) and held there to these values.
#: cycles from the MVU step that completes a row fold to that fold's output beat, for SIMD = 1
#: (weight read, product, accumulate, output queue); wider units add their adder tree's
#: register stages: :func:`mvu_fill`
MVU_FILL = 4
#: terms one registered stage of the MVU's adder tree adds (two adder levels between registers,
#: so a 48-bit stage is two carry chains deep: docs/rtl.md "Timing") [design choice]
MVU_TREE_FANIN = 4
#: fill cycles of a pool unit's turn beyond its window generator's replay
POOL_FILL = 1
#: cycles of a batchnorm unit's turn beyond its beats (its output register)
BN_FILL = 1
#: cycles a board's sequencer idles between two stage jobs (the grant drops for one cycle)
TM_SWITCH = 1


def engine_kind(layer_type: str) -> str:
    """The engine that computes a layer type: mvu | pool | norm | add | concat | mul | reshape | lookup |
    elementwise."""
    if layer_type in MVU_TYPES:
        return "mvu"
    if layer_type in POOL_TYPES:
        return "pool"
    if layer_type in ("batchnorm", "layernorm"):
        return "norm"
    if layer_type == "add":
        return "add"
    if layer_type == "flatten":
        return "reshape"
    if layer_type == "embedding":
        return "lookup"
    if layer_type in ("concat", "mul"):
        return layer_type
    return "elementwise"


def work_cycles(work, lanes, batch: int = 1):
    """ceil(work * batch / lanes), element-wise over numpy arrays too: an engine doing
    ``lanes`` units of work a cycle (MACs on a PE x SIMD MVU, elements on a stream engine)."""
    return np.ceil(np.asarray(work, dtype=float) * batch / lanes - 1e-9)


def mvu_cycles(macs: float, pe: int, simd: int, batch: int = 1) -> int:
    """ceil(macs * batch / (PE*SIMD)): equals NF*SF*vectors*batch when PE | MH and SIMD | MW."""
    return int(work_cycles(macs, pe * simd, batch))


#: passes an element-wise engine makes over its input (statistics first, then normalise)
_PASSES = {"layernorm": 2, "softmax": 2}


def stream_elements(layer) -> int:
    """Elements a non-MVU layer's engine streams per sample, one a lane a cycle.

    Element-wise engines are pipelined at II=1, so a lane takes one element a cycle however
    many operations it applies (those cost LUTs, not cycles); a pool reads every window
    element once (its ``fwd_ops``: windows x taps; the global average pool: C x H x W); a
    batchnorm is the folded inference form (scale and shift, one pass); layer norm and
    softmax pass twice (statistics, then normalise); a flatten is free on a stream.
    """
    t = layer.type
    if t == "flatten":
        return 0
    if t in POOL_TYPES:
        return max(int(layer.fwd_ops), int(layer.out_elems))
    if t == "mul":   # the broadcast operands (squeeze-excite's C scales) are read before the image
        return int(layer.out_elems) + sum(math.prod(s) for s in layer.in_shapes if math.prod(s) < layer.out_elems)
    return _PASSES.get(t, 1) * int(layer.out_elems)


def concat_cycles(out_elems: int, lanes: int) -> int:
    """Cycles per sample of a concat engine (``axis_concat``): one output beat of ``lanes``
    elements a cycle, whichever input it comes from (the planner's stream_elements of a concat:
    its output elements)."""
    return stream_cycles(out_elems, lanes)


#: element-wise layer types that multiply two data values per element (one DSP multiplier a lane)
MULTIPLYING = frozenset({"mul", "silu"})


def elementwise_dsp(layer_type: str, lanes: int, dsp_per_mac: float) -> int:
    """DSP slices of an element-wise engine: one multiplier a lane for the types that multiply
    two activations (``mul``; ``silu``: x times its sigmoid), none for compare/shift/add ones."""
    return int(math.ceil(lanes * dsp_per_mac)) if layer_type in MULTIPLYING else 0


def mvu_vector_cycles(mh: int, mw: int, pe: int, simd: int) -> int:
    """NF * SF cycles per input vector of an MH x MW MVU (PE | MH, SIMD | MW)."""
    return (mh // pe) * (mw // simd)


def stream_cycles(elems: float, lanes: int, batch: int = 1) -> int:
    """Cycles to move ``elems`` elements per sample at ``lanes`` elements per beat, one beat a cycle."""
    return int(work_cycles(elems, lanes, batch))


def width_conv_cycles(elems: int, lanes_in: int, lanes_out: int) -> int:
    """A width converter takes the slower of its input and output beat counts."""
    return max(elems // lanes_in, elems // lanes_out)


def swg_beats(c: int, h: int, w: int, k: int, pad: int, stride: int, simd: int, taps: int = 1) -> tuple[int, int]:
    """(input beats, output beats) per image of a window generator: ``simd`` channels per input
    beat; ``taps`` kernel taps per output beat (> 1 only when simd == c)."""
    oh = (h + 2 * pad - k) // stride + 1
    ow = (w + 2 * pad - k) // stride + 1
    return h * w * c // simd, oh * ow * k * k * c // (simd * taps)


def conv_window_lanes(c: int, k: int, simd: int) -> tuple[int, int]:
    """(channels per beat, taps per beat) of the window generator feeding a conv MVU of
    ``simd`` lanes over ``c`` input channels and a k x k kernel: whole pixels and
    gcd(SIMD/C, K*K) taps a beat when SIMD is a multiple of C, else gcd(C, SIMD) channels
    of one tap (the generated RTL's rule)."""
    if simd % c == 0:
        return c, math.gcd(simd // c, k * k)
    return math.gcd(c, simd), 1


def conv_window_cycles(c: int, h: int, w: int, k: int, pad: int, stride: int, simd: int) -> int:
    """Cycles per image of the window generator in front of a conv MVU of ``simd`` lanes: it
    reads at most one pixel a cycle, so a conv is never faster than its input image's pixels."""
    lanes, taps = conv_window_lanes(c, k, simd)
    return swg_cycles(c, h, w, k, pad, stride, lanes, taps)


def swg_cycles(c: int, h: int, w: int, k: int, pad: int, stride: int, simd: int, taps: int = 1) -> int:
    """Cycles per image of a window generator: the slower of reading the image and emitting windows."""
    return max(swg_beats(c, h, w, k, pad, stride, simd, taps))


def mvu_dsp(pe: int, simd: int, dsp_per_mac: float) -> int:
    """DSP slices of a PE x SIMD MVU (AMD WP486: int8 packs two MACs per DSP48E2)."""
    return int(math.ceil(pe * simd * dsp_per_mac))


def mvu_lut(pe: int, simd: int) -> int:
    """LUTs of a PE x SIMD MVU [estimate]."""
    return LUT_PER_LAYER + LUT_PER_MAC * pe * simd


def elementwise_lut(lanes: int, ops_per_elem: float) -> int:
    """LUTs of an element-wise engine of ``lanes`` lanes doing ``ops_per_elem`` ops each [estimate]."""
    return LUT_PER_LAYER + int(LUT_PER_LANE_OP * lanes * min(ops_per_elem, 8))


def swg_rows(k: int, stride: int = 1) -> int:
    """Rows of a window generator's ring: K (FINN SWG) plus STRIDE - 1, since with a stride the
    next output row's first new rows arrive while the current one still reads its K."""
    return k + stride - 1


def line_buffer_bytes(k: int, w: int, c: int, bytes_per_elem: int, stride: int = 1) -> int:
    """A window generator's line buffer: :func:`swg_rows` rows of the input."""
    return swg_rows(k, stride) * w * c * bytes_per_elem


#: bits of one beat of a kernel's m_axi port to off-chip memory (DDR/HBM): the widest data path
#: between global memory and a Vitis kernel (AMD UG1393, "Memory Interface Width
#: Considerations": 512 bits; UG1399, "Automatic Port Width Resizing"); the frame engines
#: declare their ports ap_uint<512> so the width does not depend on automatic widening
DDR_WORD_BITS = 512


def ddr_words_per_beat(lanes: int, elem_bits: int) -> int:
    """512-bit words one stream beat of ``lanes`` elements takes in off-chip memory: a beat
    starts a word (narrow beats leave the rest of theirs unused), so a frame is beats x this."""
    per_word = DDR_WORD_BITS // elem_bits
    return max(1, -(-lanes // per_word))


def frame_io_cycles(beats: int, lanes: int, elem_bits: int) -> int:
    """Cycles an off-chip frame buffer's reader or writer takes for ``beats`` beats of ``lanes``
    elements: one 512-bit word a cycle (a burst at II=1), so a beat wider than a word takes
    several (codegen: bapipe::frame_write / frame_read)."""
    return beats * ddr_words_per_beat(lanes, elem_bits)


#: a weight matrix a time-multiplexed kernel holds on chip for its turn (one tile of its
#: ping-pong weight buffer) may take at most 1/WEIGHT_TILE_SHARE of the kernel's on-chip share,
#: so the two halves take at most half of it; a bigger matrix streams through a FIFO instead,
#: re-read for every input vector [design choice]
WEIGHT_TILE_SHARE = 4


def weight_words(elems: int, elem_bits: int) -> int:
    """512-bit words a weight matrix of ``elems`` elements takes in off-chip memory: packed
    densely in the MVU's order (w[nf*SF + sf][p][s], the layout of roms.bin), so fetching it
    is that many cycles at one word a cycle (a burst at II=1; codegen: bapipe::weight_fetch)."""
    return -(-elems * elem_bits // DDR_WORD_BITS)


def weight_stream_beats(elems: int, lanes: int, elem_bits: int) -> int:
    """Cycles a weight matrix takes to stream once through a FIFO of ``lanes`` (PE x SIMD)
    element words (codegen: bapipe::weight_stream): the words read or the beats written,
    whichever are more."""
    return max(weight_words(elems, elem_bits), elems // lanes)


def weight_tiles_cycles(compute, fetch) -> int:
    """Cycles of a run of weight tiles through a ping-pong (double) buffer: tile k computes
    while tile k+1 is fetched into the other half, so the first fetch is the fill and each tile
    then takes the longer of its compute and the next tile's fetch:
    ``fetch[0] + sum_k max(compute[k], fetch[k+1])`` (the last tile fetches nothing)."""
    c, f = list(compute), list(fetch)
    return (f[0] if f else 0) + sum(max(ck, fk) for ck, fk in zip(c, f[1:] + [0]))


def window_stream_fill(k: int, pad: int, h: int, w: int, c: int, lanes: int, elem_bits: int) -> int:
    """Cycles a window engine's turn waits before its first window when its input image comes
    from an off-chip frame buffer in that turn (the window generator streams it, codegen
    swg STREAM): the K - PAD rows under the first output row, W x C / ``lanes`` beats a row
    at :func:`ddr_words_per_beat` words a beat, one word a cycle."""
    return min(k - pad, h) * (w * c // lanes) * ddr_words_per_beat(lanes, elem_bits)


def mvu_tree_stages(simd: int) -> int:
    """Registered stages of an MVU's adder tree over ``simd`` products: each adds up to
    MVU_TREE_FANIN terms, so ceil(log_FANIN(simd)) stages (0 for SIMD = 1)."""
    stages, n = 0, max(1, int(simd))
    while n > 1:
        n = -(-n // MVU_TREE_FANIN)
        stages += 1
    return stages


def mvu_fill(simd: int = 1) -> int:
    """Cycles from the MVU step that completes a row fold to its output beat: MVU_FILL plus
    the adder tree's register stages (hls_templates/rtl/engine/mvu.v.j2)."""
    return MVU_FILL + mvu_tree_stages(simd)


#: cycles a turn's off-chip weight fetch keeps it beyond its words: the sequencer's request
#: register and ddr_weights loading the count (hls_templates/rtl: tm_sequencer, ddr_weights)
WEIGHT_TURN_LAG = 2
#: cycles a job's weight fill adds beyond its words: the request, the count's load, the first grant
WEIGHT_FILL_LAG = 2


def fetch_turn_cycles(own: int, fill: int, fetch: int) -> int:
    """Cycles of a time-multiplexed turn that computes for ``own`` + ``fill`` cycles while its
    off-chip weights arrive in ``fetch`` words: the longer of the two (the sequencer holds the
    turn until ddr_weights has counted its words, WEIGHT_TURN_LAG after the last)."""
    return max(own + fill, fetch + WEIGHT_TURN_LAG) if fetch else own + fill


def turn_fill(kind: str, simd: int = 1) -> int:
    """Cycles a time-multiplexed unit's turn takes beyond its beats (pipeline fill); an MVU's
    depends on its SIMD (:func:`mvu_fill`)."""
    return {"mvu": mvu_fill(simd), "pool": POOL_FILL, "norm": BN_FILL}.get(kind, 0)


def link_beat_cycles(beat_bytes: float, bytes_per_cycle: float) -> float:
    """Cycles a link needs per beat: one beat a cycle at most, else bytes over bandwidth."""
    return max(1.0, beat_bytes / bytes_per_cycle)


# ---------------------------------------------------------------- link: the board-to-board transport
# One home of the transport's timing (docs/network.md, "Transport RTL"): the planner's link cost
# (planner.search, through link_transfer), the cycle simulator (fpga_models.sim, the same) and the
# RTL lowering (codegen.design.links.TransportSpec, codegen.rtl.train) all read these.

#: bits of one network beat: the XUP VNx network layer's application stream (S_AXIS_sk2nl /
#: M_AXIS_nl2sk, github.com/Xilinx/xup_vitis_network_example NetLayers/README.md: 512-bit data,
#: 16-bit dest, last); the Aurora kernel's user stream is widened to the same (docs/network.md)
LINK_BEAT_BITS = 512
#: bits of our framing header in every beat: 16-bit sequence number, 8-bit word count, 8 spare
LINK_HEADER_BITS = 32
#: cycles a word spends in the transport outside the channel's latency (net_pack's and net_tx's
#: output registers, net_rx's buffer write)
LINK_FRAMING_DELAY = 3
#: cycles between two acknowledgements from the receiver (net_rx)
LINK_ACK_PERIOD = 8
#: cycles of a credit round trip outside the two latencies and the ack period (tx output
#: register, rx buffer write, ack register, ack use)
LINK_LOOP = 4
#: spare window beats beyond the round trip
LINK_WINDOW_SLACK = 2
#: beats per datagram: 1 KiB of payload + 8 B UDP + 20 B IPv4 headers fits a 1500-byte MTU
LINK_FRAME_BEATS = 16


def link_words_per_beat(word_bits: int) -> int:
    """Stream words of ``word_bits`` one network beat carries after the framing header."""
    return (LINK_BEAT_BITS - LINK_HEADER_BITS) // word_bits


def link_sample_beats(words: int, word_bits: int) -> int:
    """Network beats of a sample of ``words`` words: a beat closes at the sample's end."""
    return -(-words // link_words_per_beat(word_bits))


def link_sample_cycles(words: int, word_bits: int, bytes_per_cycle):
    """Cycles a sample of ``words`` words holds the link: its beats at the line rate
    (:func:`link_beat_cycles` of a 64-byte beat), or one word a cycle when packing is slower."""
    line = link_beat_cycles(LINK_BEAT_BITS // 8, bytes_per_cycle)
    return max(words, link_sample_beats(words, word_bits) * line)


def link_delivery_cycles(words: int, word_bits: int, latency: int, slices: int = 1) -> int:
    """Cycles from a sample's last word leaving the sending stage to its arrival at the receiving
    stage: the channel's latency, the framing registers, the words of the last beat unpacked
    after its first one, and 2 more when a stage word travels as several slices."""
    last = words - (link_sample_beats(words, word_bits) - 1) * link_words_per_beat(word_bits)
    return latency + LINK_FRAMING_DELAY + last - 1 + (2 if slices > 1 else 0)


def link_round_trip(latency: int) -> int:
    """Cycles from a beat leaving the sender to its acknowledgement (or credit) being usable there."""
    return 2 * latency + LINK_ACK_PERIOD + LINK_LOOP


def link_window(bytes_per_cycle, latency: int) -> int:
    """Credits (= receive buffer beats = the sender's retransmit buffer before rounding to 2^k):
    the line's beats over a round trip, plus slack, so a fault-free link never waits for one."""
    rate = min(1, bytes_per_cycle / (LINK_BEAT_BITS // 8))
    return math.ceil(rate * link_round_trip(latency)) + LINK_WINDOW_SLACK


def link_timeout(latency: int) -> int:
    """Cycles without progress after which the sender resends from its oldest unacknowledged beat."""
    return link_round_trip(latency) + 2 * LINK_ACK_PERIOD + LINK_FRAME_BEATS


def link_lanes(elems: int, elem_bits: int, bytes_per_cycle) -> int:
    """Elements per stream word of a link that carries whole ``elems``-element vectors (the
    training RTL's train_vec_tx / train_vec_rx, and the planner's link cost): among the divisors
    of ``elems`` whose word fits a beat's payload, the one whose sample holds the link the fewest
    cycles (:func:`link_sample_cycles`); the wider on a tie."""
    best, best_c = 1, None
    for d in range(1, min(elems, (LINK_BEAT_BITS - LINK_HEADER_BITS) // elem_bits) + 1):
        if elems % d:
            continue
        c = link_sample_cycles(elems // d, d * elem_bits, bytes_per_cycle)
        if best_c is None or c <= best_c:
            best, best_c = d, c
    return best


def link_clock(board_a, board_b) -> float | None:
    """Clock of the transport between two boards (fpga_models.boards.Board): the slower board's
    (the framing kernels run on the kernel clock); None unless both are FPGAs (a link to or
    between GPUs carries the payload as it is)."""
    if board_a.kind != "fpga" or board_b.kind != "fpga":
        return None
    return min(board_a.clock_hz, board_b.clock_hz)


def link_transfer(payload_bytes, elem_bytes: int, samples: int, bandwidth_Bps: float, clock_hz: float | None):
    """(line bytes, framing latency in seconds) of one transfer of ``payload_bytes`` (numpy arrays
    allowed), ``samples`` samples of whole vectors, over a link of ``bandwidth_Bps`` between two
    FPGA boards whose transport runs at ``clock_hz``: each sample packed by :func:`link_lanes` and
    framed into beats, ``line bytes`` = the cycles it holds the line x bytes per cycle (a beat
    carries 60 payload bytes at most, so this is >= the payload), so ``line bytes / bandwidth``
    is the link's busy time; the latency is what the framing adds to the channel's
    (:func:`link_delivery_cycles` without the channel latency). ``clock_hz`` None (a link that
    is not our transport: GPUs, hosts) -> (payload, 0)."""
    pb = np.asarray(payload_bytes, dtype=float)
    if clock_hz is None or not math.isfinite(bandwidth_Bps) or samples < 1:
        return (pb if pb.ndim else float(pb)), (np.zeros_like(pb) if pb.ndim else 0.0)
    bpc = bandwidth_Bps / clock_hz
    bits = 8 * elem_bytes
    line = np.zeros(pb.shape)
    extra = np.zeros(pb.shape)
    cache: dict[int, tuple[float, float]] = {}
    for idx, b in np.ndenumerate(pb):
        elems = int(round(b / elem_bytes / samples))
        if elems <= 0:
            continue
        if elems not in cache:
            ln = link_lanes(elems, bits, bpc)
            words = elems // ln
            cache[elems] = (float(link_sample_cycles(words, ln * bits, bpc)) * bpc,
                            link_delivery_cycles(words, ln * bits, 0) / clock_hz)
        line[idx] = samples * cache[elems][0]
        extra[idx] = cache[elems][1]
    return (line if pb.ndim else float(line)), (extra if pb.ndim else float(extra))


# ---------------------------------------------------------------- training engines (backward, update)
# The training RTL (codegen/rtl/train.py, hls_templates/rtl/mvu_bwd_*.v.j2, sgd_update.v.j2,
# train_relu.v.j2) runs each engine for exactly these cycles per sample; the planner prices a
# layer's backward as ceil((bwd_in + bwd_w MACs) / (PE*SIMD)) (fpga_models.cost), equal to
# their sum when PE | MH and SIMD | MW.

def mvu_bwd_cycles(mh: int, mw: int, pe: int, simd: int) -> tuple[int, int]:
    """(input-gradient, weight-gradient) cycles per sample of a dense layer's backward engines:
    both visit the MH x MW matrix one PE x SIMD tile a cycle (dx = W^T dy; dW += dy x^T)."""
    n = mvu_vector_cycles(mh, mw, pe, simd)
    return n, n


def conv_train_cycles(mh: int, mw: int, pixels: int, pe: int, simd: int) -> tuple[int, int, int]:
    """(forward, input-gradient, weight-gradient) cycles per sample of a conv2d layer's training
    engines (hls_templates/rtl/train_conv_fwd, conv_bwd_in, conv_bwd_w): each visits the
    MH x MW (= O x K*K*C) matrix one PE x SIMD tile a cycle for every output pixel, the input
    gradient scattering each pixel's im2col row into the input (col2im), so all three are
    NF x SF x pixels = MACs / (PE x SIMD): the planner's ``mvu_cycles`` of the layer's
    ``fwd_macs``, ``bwd_in_macs`` and ``bwd_w_macs`` (all three equal for conv2d, any stride
    and padding). The planner's forward also takes the window generator's
    ``conv_window_cycles`` when slower; the training engine reads its image from memory, so
    the training RTL refuses such a folding instead of idling."""
    n = mvu_vector_cycles(mh, mw, pe, simd) * pixels
    return n, n, n


def pool_train_cycles(work: int, lanes: int) -> tuple[int, int]:
    """(forward, backward) cycles per sample of a max/avg pool's training engine
    (hls_templates/rtl/train_pool): ``work`` = :func:`stream_elements` of the layer (every
    window element once) at ``lanes`` a cycle both ways, as the planner prices it (backward
    work x 1.0 for pools, fpga_models.cost._BWD_WORK)."""
    n = stream_cycles(work, lanes)
    return n, n


def relu_bwd_cycles(elems: int, lanes: int) -> int:
    """Cycles per sample of a ReLU backward engine: ``lanes`` elements a cycle, like the forward."""
    return stream_cycles(elems, lanes)


def batchnorm_train_cycles(elems: int, lanes: int) -> tuple[int, int]:
    """(forward, backward) cycles per sample of an affine batchnorm's training engine
    (hls_templates/rtl/train_batchnorm; fpga_models.train_fixed: y = x scale + shift, scale and
    shift trained): ``lanes`` elements a cycle both ways; the backward's one pass writes
    dx = dy scale and adds dy x and dy into the per-channel sums (HLS batchnorm_bwd_train: n/L
    a sample too); the planner prices it the same (backward work 1.0 x, fpga_models.cost._BWD_WORK:
    not the two passes of a batch-statistics norm)."""
    n = stream_cycles(elems, lanes)
    return n, n


def add_train_cycles(elems: int, lanes: int) -> int:
    """Cycles per sample of a saturating two-input sum at ``lanes`` elements a cycle
    (hls_templates/rtl/train_add): a residual add's forward, and in backward the sum of the two
    gradients where its skip branch forked (the add's own backward passes dy on unchanged)."""
    return stream_cycles(elems, lanes)


def sgd_update_cycles(mh: int, mw: int, pe: int, simd: int) -> int:
    """Cycles of one SGD(+momentum) update of an MH x MW dense layer: one PE x SIMD tile of
    weights (and velocities) a cycle, the MH biases with the last tile; the training RTL runs it
    trailing the last weight-gradient pass of the iteration, so it adds about one cycle."""
    return mvu_vector_cycles(mh, mw, pe, simd)
