"""The ``train`` part of a training build's xrt manifest (bapipe-build.json, section ``xrt``):
what host/backends/xrt_train.py allocates, loads and starts, read off the kernels' C
parameter lists (an argument's index is its position there, as XRT numbers them).

Per stage: its position in the pipeline and its boards (one per replica), the samples a
replica computes per micro-batch, the stash slots (bapipe.schedules.stash_count: the forward
call of micro-batch j and the backward call of j get slot j mod S) and, per kernel (forward,
backward, update, all-reduce), its arguments with a kind and, for the memories several
kernels share, a ``buffer`` key (the host passes them one buffer):

- ``rom:<name>``     the forward's banked weight arrays (loaded from the stage's weights.bin), rewritten by the update;
- ``w16:<name>``     the backward's 16-bit weights (kernel layout), rewritten by the update;
- ``grad:<name>``    the backward's exact gradient sums, read (and all-reduced) for the update;
- ``master:<name>``, ``vel:<name>``  the update's master weights (int32) and velocities (int64);
- ``stash:<tensor>`` the forward's stash of a tensor and every backward port reading it (per slot);
- ``scratch``        off-chip frames and accumulators private to one kernel.

And the loss kernel behind the last stage (logits in, gradient out on streams; labels).
"""
from __future__ import annotations

from bapipe.codegen.design.weight_image import image_path

WSUM_BYTES = 8


def _whole(n: int) -> int:
    """Elements of a buffer the update and all-reduce kernels stream as words
    (fpga_models.update.padded_elements: whole 64-byte words of sums; the pad lanes stay zero)."""
    from bapipe.fpga_models.update import padded_elements
    return padded_elements(n)


def _arg(args: list, name: str, kind: str, **kw) -> None:
    args.append({"index": len(args), "name": name, "kind": kind, **kw})


def _forward(s, eb: int) -> list[dict]:
    args: list[dict] = []
    for p in s.inputs + s.outputs:
        _arg(args, p.name, "stream")
    for r in s.engine.external:   # from the stage's weight image (codegen.design.weight_image)
        _arg(args, r.name, "weights", buffer=f"rom:{r.name}", bytes=r.size * eb, file=image_path(s.name),
             offset=r.offset * eb)
    for f in s.engine.frames:
        _arg(args, f.name, "scratch", bytes=f.bytes)
    for b in s.engine.stashes:
        _arg(args, b.name, "stash", buffer=f"stash:{b.tensor}", tensor=b.tensor, bytes=b.mb * b.elements * eb)
    _arg(args, "n", "samples")
    return args


def _backward(s, eb: int) -> list[dict]:
    b = s.bwd
    args: list[dict] = []
    for p in b.in_ports + b.out_ports:
        _arg(args, p.name, "stream")
    for st in b.stashes:
        _arg(args, st.name, "stash", buffer=f"stash:{st.tensor}", tensor=st.tensor, bytes=b.mb * st.elements * eb)
    for g in b.grad_arrays:
        _arg(args, g.name, "grad", buffer=f"grad:{g.name}", bytes=_whole(g.count) * WSUM_BYTES)
    for a in b.acc_ports:
        _arg(args, a.name, "scratch", bytes=a.bytes)
    for w in b.weights:
        _arg(args, w.name, "weights16", buffer=f"w16:{w.name}", bytes=_whole(int(w.kernel_q.size)) * eb)
    for f in b.frames:
        _arg(args, f.name, "scratch", bytes=f.bytes)
    _arg(args, "n", "samples")
    _arg(args, "flush", "flush")
    return args


def _update(u, eb: int) -> list[dict]:
    args: list[dict] = []
    for a in u.arrays:
        n = _whole(a.count)
        _arg(args, f"g_{a.name}", "grad", buffer=f"grad:{a.grad}", bytes=n * WSUM_BYTES)
        _arg(args, f"m_{a.name}", "master", buffer=f"master:{a.name}", bytes=n * 4, layer=a.layer, key=a.key,
             rows=a.rows, cols=a.cols, elements=a.count)
        _arg(args, f"v_{a.name}", "velocity", buffer=f"vel:{a.name}", bytes=n * 8)
        _arg(args, a.name, "weights16", buffer=f"w16:{a.name}", bytes=n * eb)
    for r, n in u.roms:
        _arg(args, r, "weights", buffer=f"rom:{r}", bytes=n * eb)
    for c in ("mu", "lr", "shift"):
        _arg(args, c, c)
    return args


def _allreduce(u) -> list[dict]:
    args: list[dict] = []
    _arg(args, "ring_in", "stream")
    _arg(args, "ring_out", "stream")
    for g, n in u.grads:   # the sender's read-only view of each sum buffer ...
        _arg(args, f"snd_{g}", "grad", buffer=f"grad:{g}", bytes=_whole(n) * WSUM_BYTES)
    for g, n in u.grads:   # ... and the receiver's read-write one: the same buffer
        _arg(args, g, "grad", buffer=f"grad:{g}", bytes=_whole(n) * WSUM_BYTES)
    _arg(args, "rank", "rank")
    _arg(args, "replicas", "replicas")
    return args


def train_manifest(ctx, elem_bytes: int) -> dict | None:
    """The manifest's ``train`` section (module docstring), or None for an inference build or
    one the xrt host cannot train (why: ``refused``)."""
    from bapipe.schedules import stash_count

    plan = ctx.plan
    if plan.mode != "train":
        return None
    stages, why = [], []
    p = len(ctx.stages)
    m = max(1, plan.microbatches)
    for d, s in enumerate(ctx.stages):
        if s.engine is None or s.bwd is None:
            why.append(f"{s.name}: not an engine kernel with a backward kernel")
            continue
        if s.bwd.stashes and not s.engine.stashes:
            why.append(f"{s.name}: its forward kernel writes no stashes ({s.stash_note})")
        if s.update is None and s.bwd.grad_arrays:
            why.append(f"{s.name}: no update kernel ({s.update_note})")
        u = s.update
        stages.append({
            "stage": s.index, "name": s.name, "position": d, "boards": list(s.boards),
            "replicas": max(1, len(s.boards)), "mb": s.bwd.mb,
            "slots": stash_count(plan.schedule, p, d, m),
            "forward": {"kernel": s.name, "instance": f"{s.name}_1", "args": _forward(s, elem_bytes)},
            "backward": {"kernel": s.bwd.name, "instance": f"{s.bwd.name}_1", "args": _backward(s, elem_bytes)},
            "update": None if u is None else {"kernel": u.name, "instance": f"{u.name}_1", "args": _update(u, elem_bytes)},
            "allreduce": None if u is None or u.replicas < 2 else {
                "kernel": u.allreduce_name, "instance": f"{u.allreduce_name}_1", "args": _allreduce(u)},
        })
    last = ctx.stages[-1] if ctx.stages else None
    loss = getattr(last, "loss", None)
    if loss is None:
        why.append("no loss kernel behind the last stage (its output is not one vector of logits)")
    return {"schedule": plan.schedule, "microbatches": m, "microbatch_size": max(1, plan.microbatch_size),
            "stages": stages, "refused": "; ".join(why) or None,
            "loss": None if loss is None else {
                "kernel": loss.name, "instance": f"{loss.name}_1", "stage": last.index, "boards": list(last.boards),
                "args": [{"index": 0, "name": "z_in", "kind": "stream"}, {"index": 1, "name": "dz_out", "kind": "stream"},
                         {"index": 2, "name": "labels", "kind": "labels", "bytes": 4 * loss.max_samples},
                         {"index": 3, "name": "n", "kind": "samples"}]}}
