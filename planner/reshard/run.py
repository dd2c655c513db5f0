"""Execute a planned resharding between processes and set it beside the model and a baseline.

``run_resharding`` executes the best plan of a ``best_transfer`` Result (``dist.py``), and
the naive baseline (``p2p/first``: every receiver gets each box point to point from the
first holder, in task order) the same way, each ``repeat`` times. The model's time for
each is the plan re-timed on the transport measured on this machine
(``transport.retime`` on ``transport_network``), so measured and model describe the same
transfers on the same processes.
"""
from __future__ import annotations

import statistics

from .api import Result
from .dist import DistResult, execute_distributed
from .layout import Layout
from .transport import Transport, measure_transport, retime, transport_network

BASELINE = "p2p/first"


def _runs(plan, repeat: int, **kw) -> list[DistResult]:
    return [execute_distributed(plan, **kw) for _ in range(max(1, repeat))]


def _links(d: dict) -> list[dict]:
    return [{"src": a, "dst": b, "bytes": n} for (a, b), n in sorted(d.items())]


def run_resharding(res: Result, shape, dtype: str, src_mesh, src_layout: Layout, dst_mesh, dst_layout: Layout,
                   src_devices, dst_devices, backend: str = "gloo", repeat: int = 1,
                   transport: Transport | None = None, baseline: bool = True, timeout_s: float = 120.0) -> dict:
    """Execute the best plan (and the p2p/first baseline) between processes; the JSON-ready report.

    Keys: ``bit_exact`` (every destination tile of every run equal bit for bit),
    ``measured_s`` (median over ``repeat`` runs of the best plan), ``model_s`` (the same
    plan on the measured transport), ``bytes_match_plan`` (bytes sent per device and per
    link, and received per device, measured at the ranks, equal to the plan's), the
    baseline's ``naive_measured_s`` / ``naive_model_s``, the transport, the per-device and
    per-link bytes, the plan's own (planning network) time ``plan_s``, and ``copy_bound_s``:
    the plan's bytes over the measured aggregate rate of concurrent pairs (on one machine
    the processes share its cores and memory, which the per-port model does not describe).
    """
    tr = transport or measure_transport(backend, reps=10)
    net = transport_network(src_devices, dst_devices, tr)
    kw = dict(shape=shape, dtype=dtype, src_mesh=src_mesh, src_layout=src_layout, dst_mesh=dst_mesh,
              dst_layout=dst_layout, src_devices=src_devices, dst_devices=dst_devices, backend=backend,
              timeout_s=timeout_s)
    best = res.best
    runs = _runs(best, repeat, **kw)
    out = {"executed": best.name, "backend": backend, "ranks": runs[0].ranks, "repeat": len(runs),
           "bit_exact": all(r.bit_exact for r in runs), "bytes_match_plan": all(r.bytes_match_plan for r in runs),
           "measured_s": statistics.median(r.measured_s for r in runs),
           "measured_runs_s": [r.measured_s for r in runs],
           "model_s": retime(best, net).time_s, "plan_s": best.time_s,
           # every byte through the machine's aggregate copy rate (2 pairs at once, measured):
           # what one shared machine can do however many ports the model gives its processes
           "copy_bound_s": sum(runs[0].plan_sent_bytes.values()) / tr.aggregate_Bps,
           "wrong_elements": sum(r.wrong_elements for r in runs),
           "missing_elements": sum(r.missing_elements for r in runs),
           "sent_bytes": runs[0].sent_bytes, "received_bytes": runs[0].received_bytes,
           "link_bytes": _links(runs[0].link_bytes), "plan_sent_bytes": runs[0].plan_sent_bytes,
           "transport": tr.to_dict()}
    if baseline:
        naive = next(p for p in res.plans if p.name == BASELINE)
        nruns = _runs(naive, repeat, **kw)
        out.update({"naive": BASELINE, "naive_measured_s": statistics.median(r.measured_s for r in nruns),
                    "naive_model_s": retime(naive, net).time_s,
                    "naive_copy_bound_s": sum(nruns[0].plan_sent_bytes.values()) / tr.aggregate_Bps,
                    "naive_bit_exact": all(r.bit_exact for r in nruns),
                    "naive_bytes_match_plan": all(r.bytes_match_plan for r in nruns)})
    return out
