"""`bapipe models | boards | clusters | profile`: what is built in, and per-layer cost."""
from __future__ import annotations

import io

from bapipe.errors import SpecError


def _table(headers: list[str], rows: list[list], title: str | None = None) -> str:
    """Render a table with rich (to a string, no terminal needed)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, show_lines=False)
    for i, h in enumerate(headers):
        t.add_column(h, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    con = Console(width=160, file=io.StringIO())
    con.print(t)
    return con.file.getvalue()


def _si(x: float, unit: str = "") -> str:
    """Engineering notation (bapipe.units.si): 1.23G, 4.56 ms, 250 MHz."""
    from bapipe.units import si

    return si(x, unit)


def _iec(n: float) -> str:
    """Bytes in IEC units (bapipe.units.nbytes): 64 GiB, 1 KiB."""
    from bapipe.units import nbytes

    return nbytes(n)


#: the number format whose peak `bapipe boards` shows: every command's default (fixed16)
PEAK_FORMAT = "fixed16"
#: fixed-point operations are not floating-point ones: 2 OP per multiply-accumulate
PEAK_UNIT = "OP/s"


def cmd_models(args) -> dict:
    """The zoo with parameter and MAC totals."""
    from bapipe import zoo

    out = []
    for name in zoo.ZOO:
        m = zoo.get(name)
        out.append({**m.summary(), "inputs": [{"name": i.name, "shape": list(i.shape)} for i in m.inputs],
                    "description": m.description})
    return {"models": out}


def show_models(r: dict) -> str:
    """Zoo table."""
    rows = [[m["name"], f"{m['params']:,}", _si(m["fwd_macs"]), _si(m["bwd_macs"]), m["layers"],
             " ".join("x".join(map(str, i["shape"])) for i in m["inputs"])] for m in r["models"]]
    return _table(["model", "params", "fwd MAC/sample", "bwd MAC/sample", "layers", "input"], rows, "model zoo")


def cmd_boards(args) -> dict:
    """The board catalog."""
    from bapipe.fpga_models.boards import BOARDS

    return {"boards": [b.to_dict() for b in BOARDS.values()]}


def _peak(b: dict) -> str:
    """A board's peak at the default format as the planner prices it: a GPU has no fixed16
    datapath and runs it as fp16 (fpga_models.cost.gpu_format), so its FLOP/s at that format."""
    if b["kind"] != "gpu":
        return _si(b.get("peak_flops", {}).get(PEAK_FORMAT, 0), PEAK_UNIT)
    from bapipe.fpga_models.boards import BOARDS
    from bapipe.fpga_models.cost import gpu_format

    f = gpu_format(BOARDS[b["name"]], PEAK_FORMAT)
    return f"{_si(b['peak_flops'][f], 'FLOP/s')} ({f})"


def show_boards(r: dict) -> str:
    """Board table."""
    rows = [[b["name"], b["kind"], f"{b['dsp']:,}", f"{b['usable_dsp']:,}", f"{b['bram36']:,}", f"{b['uram']:,}",
             f"{b['lut']:,}", _si(b["clock_hz"], "Hz"), _iec(b["offchip_bytes"]), _iec(b["offchip_bw_Bps"]) + "/s",
             _peak(b)] for b in r["boards"]]
    return _table(["board", "kind", "DSP", "usable DSP", "BRAM36", "URAM", "LUT", "clock", "off-chip", "bandwidth",
                   f"peak {PEAK_FORMAT}"], rows, "board catalog (peak at the default number format; --json: every format)")


def cmd_clusters(args) -> dict:
    """The built-in clusters."""
    from bapipe.fpga_models.cluster import builtin_clusters

    out = []
    for c in builtin_clusters().values():
        out.append({"name": c.name, "boards": len(c.boards), "board_types": c.board_types(),
                    "topology": c.topology, "hosts": len(c.hosts), "links": len(c.links)})
    return {"clusters": out}


def show_clusters(r: dict) -> str:
    """Cluster table."""
    rows = [[c["name"], c["boards"], ",".join(c["board_types"]), c["topology"], c["hosts"], c["links"]]
            for c in r["clusters"]]
    return _table(["cluster", "boards", "types", "topology", "hosts", "links"], rows, "built-in clusters")


def check_profile_options(fmt: str, batch: int) -> None:
    """SpecError naming --format or --batch (checked before any model is loaded)."""
    from bapipe.fpga_models.boards import FORMATS

    if fmt not in FORMATS:
        raise SpecError(None, None, "--format", f"expected one of {', '.join(FORMATS)}; got {fmt!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise SpecError(None, None, "--batch", "expected an integer >= 1")


def profile_result(model, cluster, fmt: str = "fixed16", batch: int = 1, measured: str | None = None) -> dict:
    """Per-layer counts and cost of ``model`` on each board type of ``cluster`` (loaded
    objects; ``measured``: a profile file replacing the cost model): the --json object of
    `bapipe profile` (bapipe.api.profile and the command both come here)."""
    from bapipe.fpga_models.boards import bytes_per_element

    check_profile_options(fmt, batch)
    if measured:
        from bapipe.profiles import load_profile

        # require_batch: the planner's rule; a file without its batch once read as batch 1 here (64x off)
        measured = {t: load_profile(measured, model, board=t, batch=batch, require_batch=True)
                    for t in cluster.board_types()}
    from bapipe.fpga_models.cost import profile_layer

    bpe = bytes_per_element(fmt)
    types = cluster.board_types()
    boards = {t: next(cb.board for cb in cluster.boards if cb.board.name == t) for t in types}
    layers = []
    for layer in model.layers:
        cost = {}
        for t, b in boards.items():
            if measured:
                m = measured[t][layer.name]
                cost[t] = {"fwd_s": m["fwd_s"], "bwd_s": m["bwd_s"], "source": "measured"}
            else:
                c = profile_layer(layer, b, fmt, batch)
                cost[t] = {"fwd_s": c["fwd_s"], "bwd_s": c["bwd_s"]}
        layers.append({
            "name": layer.name, "type": layer.type, "out_shape": list(layer.out_shape),
            "params": layer.weight_params, "fwd_macs": layer.fwd_macs, "bwd_macs": layer.bwd_macs,
            "activation_bytes": layer.out_elems * bpe * batch, "weight_bytes": layer.weight_params * bpe,
            "cost": cost,
        })
    totals = {t: {"fwd_s": sum(l["cost"][t]["fwd_s"] for l in layers),
                  "bwd_s": sum(l["cost"][t]["bwd_s"] for l in layers)} for t in types}
    return {"model": model.name, "cluster": cluster.name, "format": fmt, "batch": batch,
            "params": model.params, "fwd_macs": model.fwd_macs, "layers": layers, "totals": totals}


def show_profile(r: dict) -> str:
    """Per-layer table: counts and fwd/bwd time per board type."""
    types = list(r["totals"])
    headers = ["layer", "type", "out", "params", "fwd MAC", "act bytes"]
    for t in types:
        headers += [f"{t} fwd", f"{t} bwd"]
    rows = []
    for l in r["layers"]:
        row = [l["name"], l["type"], "x".join(map(str, l["out_shape"])), f"{l['params']:,}", _si(l["fwd_macs"]),
               _iec(l["activation_bytes"])]
        for t in types:
            row += [_si(l["cost"][t]["fwd_s"], "s"), _si(l["cost"][t]["bwd_s"], "s")]
        rows.append(row)
    row = ["total", "", "", f"{r['params']:,}", _si(r["fwd_macs"]), ""]
    for t in types:
        row += [_si(r["totals"][t]["fwd_s"], "s"), _si(r["totals"][t]["bwd_s"], "s")]
    rows.append(row)
    return _table(headers, rows, f"{r['model']} on {r['cluster']} ({r['format']}, batch {r['batch']})")
