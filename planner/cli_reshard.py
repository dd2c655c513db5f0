"""`bapipe reshard`: plan one cross-mesh resharding and compare strategies with the bound."""
from __future__ import annotations

import sys
from math import prod

from bapipe.errors import SpecError

from .reshard import best_transfer, default_network, network_from_cluster
from .reshard.layout import dtype_bytes, mesh_str, parse_layout, parse_mesh, parse_shape


def _network(args, src_mesh, dst_mesh):
    """The default network, or a cluster's boards: the source mesh on the first ones, the
    destination mesh on the next ones; when the cluster is too small for both, the
    destination mesh takes the last boards and the meshes share boards (in place)."""
    if not args.cluster:
        return default_network(src_mesh, dst_mesh)
    from bapipe.fpga_models.cluster import load_cluster

    cluster = load_cluster(args.cluster)
    names = [cb.name for cb in cluster.boards]
    ns, nd = prod(src_mesh), prod(dst_mesh)
    if max(ns, nd) > len(names):
        raise SpecError(None, None, "--cluster", f"cluster '{cluster.name}' has {len(names)} boards; expected at "
                                                 f"least {max(ns, nd)} for a {max(ns, nd)}-board mesh")
    dst = names[ns:ns + nd] if ns + nd <= len(names) else names[len(names) - nd:]
    return network_from_cluster(cluster, names[:ns], dst)


def cmd_reshard(args) -> dict:
    """The --json object: tasks, lower bound, every strategy's time and ratio, the best."""
    shape = parse_shape(args.shape, "--shape")
    nbytes = dtype_bytes(args.dtype, "--dtype")
    src_mesh = parse_mesh(args.src_mesh, "--src-mesh")
    dst_mesh = parse_mesh(args.dst_mesh, "--dst-mesh")
    src = parse_layout(args.src, len(shape), src_mesh, "--src")
    dst = parse_layout(args.dst, len(shape), dst_mesh, "--dst")
    net = _network(args, src_mesh, dst_mesh)
    res = best_transfer(shape, nbytes, src_mesh, src, dst_mesh, dst, net, seed=int(args.seed or 0))
    delivered = sum(t.nbytes * len(t.receivers) for t in res.tasks)
    strategies = []
    for p in res.plans:
        strategies.append({"name": p.name, "time_s": p.time_s, "ratio_to_bound": res.ratio_to_bound(p),
                           "effective_Bps": delivered / p.time_s if p.time_s > 0 else 0.0,
                           "transfers": len(p.transfers)})
    b = res.bound
    out = {"shape": list(shape), "dtype": args.dtype, "src_mesh": mesh_str(src_mesh), "src": str(src),
            "dst_mesh": mesh_str(dst_mesh), "dst": str(dst), "network": net.name,
            "tensor_bytes": res.nbytes, "delivered_bytes": delivered,
            "tasks": len(res.tasks), "lower_bound_s": res.lower_bound_s,
            "bound_terms": {"group_ingress_s": b.group_ingress_s, "holder_egress_s": b.holder_egress_s,
                            "device_ingress_s": b.device_ingress_s, "latency_s": b.latency_s},
            "strategies": strategies, "best": res.strategy}
    if not getattr(args, "execute", False):
        return out
    return _execute(args, res, shape, src_mesh, src, dst_mesh, dst, net, out)


def _execute(args, res, shape, src_mesh, src, dst_mesh, dst, net, out):
    """--execute: run the best plan and the p2p/first baseline between processes (planner.reshard.run)."""
    from .reshard.dist import TORCH_DTYPES, TransferFailure, require_torch

    if args.repeat < 1:
        raise SpecError(None, None, "--repeat", f"expected a positive integer, got {args.repeat}")
    if not args.timeout > 0:
        raise SpecError(None, None, "--timeout", f"expected seconds > 0, got {args.timeout}")
    if str(args.dtype).lower() not in TORCH_DTYPES:
        raise SpecError(None, None, "--dtype", f"{args.dtype!r} cannot be executed; expected one of "
                                               f"{', '.join(TORCH_DTYPES)}")
    require_torch()
    from .reshard.run import run_resharding

    try:
        ex = run_resharding(res, shape, str(args.dtype).lower(), src_mesh, src, dst_mesh, dst, net.src_devices,
                            net.dst_devices, backend=args.backend, repeat=args.repeat, timeout_s=args.timeout)
    except TransferFailure as e:
        sys.stderr.write(f"{e}\n")
        return {**out, "error": str(e), "bit_exact": False}, 1
    return {**out, **ex}


def show_reshard(r: dict) -> str:
    """Human table: predicted time, effective bandwidth and ratio to the bound per strategy."""
    from bapipe.units import nbytes, seconds
    lines = [f"reshard {'x'.join(map(str, r['shape']))} {r['dtype']}: {r['src_mesh']} {r['src']} -> "
             f"{r['dst_mesh']} {r['dst']}  (network {r['network']}, {r['tasks']} unit tasks, "
             f"{nbytes(r['delivered_bytes'])} delivered)",
             f"lower bound {seconds(r['lower_bound_s'], 4)}", "",
             f"  {'strategy':<16} {'time':>12} {'eff. GiB/s':>10} {'x bound':>8}"]
    for s in r["strategies"]:
        mark = "*" if s["name"] == r["best"] else " "
        lines.append(f"{mark} {s['name']:<16} {seconds(s['time_s'], 4):>12} {s['effective_Bps'] / 2**30:>10.2f} "
                     f"{s['ratio_to_bound']:>8.3f}")
    lines += ["", f"best: {r['best']}  (effective bandwidth = bytes the receivers take in / time)"]
    if "error" in r:
        lines.append(f"execute: FAILED: {r['error']}")
    elif "measured_s" in r:
        t = r["transport"]
        lines += ["", f"executed {r['executed']} on {r['ranks']} processes over {r['backend']} "
                      f"(transport measured: {t['pair_Bps'] / 1e9:.2f} GB/s per pair, "
                      f"{t['latency_s'] * 1e6:.0f} us latency)",
                  f"  bit-exact: {r['bit_exact']}   bytes per device and link as planned: {r['bytes_match_plan']}",
                  f"  {'plan':<12} {'measured ms':>12} {'model ms':>10}",
                  f"  {r['executed']:<12} {r['measured_s'] * 1e3:>12.3f} {r['model_s'] * 1e3:>10.3f}"]
        if "naive_measured_s" in r:
            lines.append(f"  {r['naive']:<12} {r['naive_measured_s'] * 1e3:>12.3f} {r['naive_model_s'] * 1e3:>10.3f}")
    return "\n".join(lines)
