"""Hand-made plans for tests and demos: a model cut at given layer positions.

``bapipe plan`` is the real source of plans; this builds the same Plan object directly
(with correct fingerprints) so the driver can be tested on any cut and schedule.
"""
from __future__ import annotations

from bapipe.plan import Plan, Stage
from bapipe.spec import load_model


def hand_plan(model: str, cluster: str = "4xU250-ring", cuts: tuple[int, ...] = (), schedule: str = "1f1b",
              microbatches: int = 4, microbatch_size: int = 16, chunks: int = 1, optimizer: str = "sgd",
              number_format: str = "fixed16", replicas: tuple[int, ...] | None = None) -> Plan:
    """A plan that cuts ``model`` after each layer position in ``cuts``.

    Non-interleaved: stage i on device i. Interleaved: ``len(cuts)+1`` must be p*chunks,
    and stage i sits on device i % p, chunk i // p. ``replicas`` gives each stage's
    data-parallel copies; boards are handed out in cluster order (wrapping around).
    """
    from fpga_models.cluster import load_cluster

    mdl = load_model(model)
    cl = load_cluster(cluster)
    bounds = [-1, *cuts, len(mdl.layers) - 1]
    n = len(bounds) - 1
    v = chunks if schedule == "interleaved" else 1
    if n % v:
        raise ValueError(f"{n} stages do not split into {v} chunks")
    p = n // v
    boards = [b.name for b in cl.boards]
    reps = list(replicas) if replicas else [1] * n
    stages = []
    nxt = 0
    dev_boards: dict[int, list[str]] = {}
    for i in range(n):
        first, last = bounds[i] + 1, bounds[i + 1]
        d, c = i % p, i // p
        if d not in dev_boards:  # chunks of one device share its boards
            dev_boards[d] = [boards[(nxt + k) % len(boards)] for k in range(reps[i])]
            nxt += reps[i]
        stages.append(Stage(index=i, layers=[l.name for l in mdl.layers[first:last + 1]], first=first, last=last,
                            boards=dev_boards[d], board_type=cl.boards[0].board.name, replicas=reps[i],
                            chunk=c, device=d))
    return Plan(model=model, model_fingerprint=mdl.fingerprint(), cluster=cluster,
                cluster_fingerprint=cl.fingerprint(), schedule=schedule, chunks=v, microbatches=microbatches,
                microbatch_size=microbatch_size, global_batch=microbatches * microbatch_size,
                number_format=number_format, optimizer=optimizer, stages=stages)
