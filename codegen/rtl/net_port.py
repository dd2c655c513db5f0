"""The framing kernel of one QSFP28 port (XUP VNx side), rendered from the transports the
lowering decided (codegen.design.links)."""
from __future__ import annotations

from bapipe.codegen.design.links import TransportSpec, count_bits
from bapipe.codegen.design.netnames import MAX_CHANNELS, net_kernel
from bapipe.codegen.rtl.env import render_template


def render_net_port(tx: list[TransportSpec], rx: list[TransportSpec], plan_hash: str = "none",
                    module: str | None = None) -> tuple[str, str]:
    """(module name, Verilog) of the framing kernel of one QSFP28 port with outgoing channels
    ``tx`` (socket k = position k) and incoming ``rx`` (socket len(tx) + j); its name is
    ``module``, by default codegen.design.netnames.net_kernel(len(tx), len(rx)) (the packaged kernels
    name theirs after the board port: codegen.package.network.net_kernels)."""
    if not 0 < len(tx) + len(rx) <= MAX_CHANNELS:
        raise ValueError(f"a port carries 1..{MAX_CHANNELS} channels, not {len(tx) + len(rx)}")
    module = module or net_kernel(len(tx), len(rx))

    def send_params(t: TransportSpec, k: int) -> list[tuple[str, int]]:
        p = {"STAGE_W": t.stage_w, "CONV_W": count_bits(t.slices), **t.pack_params(), **t.tx_params(), "DEST": k}
        return list(p.items())

    def recv_params(t: TransportSpec) -> list[tuple[str, int]]:
        # the receiving stage's word may differ from the sender's (a packaged kernel whose consumer
        # takes more or fewer lanes a beat): the join converts either way (axis_width_conv)
        ratio = max(t.stage_w, t.data_w) // min(t.stage_w, t.data_w)
        p = {"STAGE_W": t.stage_w, "CONV_W": count_bits(ratio), **t.unpack_params(), **t.rx_params()}
        p["DATA_W"] = t.data_w
        return list(p.items())

    ctx = {"module": module, "sel_w": count_bits(2 * max(1, len(tx))),
           "tx": [{"k": k, "stage_w": t.stage_w, "words": t.words, "window": t.window, "params": send_params(t, k)}
                  for k, t in enumerate(tx)],
           "rx": [{"j": j, "stage_w": t.stage_w, "words": t.words, "window": t.window, "params": recv_params(t)}
                  for j, t in enumerate(rx)]}
    return module, render_template("net_port", plan_hash, **ctx)
