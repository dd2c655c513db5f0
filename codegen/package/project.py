"""The project a Vitis user builds: the HLS files (codegen.hls), the framing kernels the link
configs name (codegen.package.network) and the Makefile over both, path -> bytes."""
from __future__ import annotations

from bapipe.codegen.design.context import ProjectCtx
from bapipe.codegen.hls.project import comment, environment, render_kernels
from bapipe.codegen.package.network import link_objects, makefile_context, net_kernel_files, net_kernels


def render_files(ctx: ProjectCtx, plan_text: str, cluster=None, engines: str = "hls") -> dict[str, bytes]:
    """Every file of the project, path -> bytes (nothing touches the disk here). ``engines``:
    which stage kernels the Makefile builds (hls: Vitis HLS; rtl: codegen.package's RTL kernels)."""
    files, pl = render_kernels(ctx, plan_text, cluster)
    loss = ctx.stages[-1].loss if ctx.stages else None   # the loss kernel (codegen.design.lower)
    kernels = [k for s in ctx.stages for k in ([s.name] + ([s.bwd.name] if s.bwd else [])
                                               + ([s.update.name] if s.update else [])
                                               + ([s.update.allreduce_name] if s.update and s.update.replicas > 1
                                                  else []))] + ([loss.name] if loss else [])
    # the framing kernels the link configs name, packaged as RTL kernels (codegen.package.network)
    net = net_kernels(ctx, cluster, pl, engines)
    files.update({p: t.encode() for p, t in net_kernel_files(net, ctx.fingerprint).items()})
    files["Makefile"] = environment().get_template("Makefile.j2").render(
        fmt=ctx.fmt, header=comment(ctx.header, "#"), stages=ctx.stages, kernels=kernels, loss=loss,
        boards=[b for b in ctx.boards if b.platform], engines=engines, net=makefile_context(net),
        links=link_objects(ctx, pl, net)).encode()
    return files
