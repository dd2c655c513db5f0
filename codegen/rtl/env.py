"""The Verilog templates' one Jinja environment and the module lists every RTL build shares."""
from __future__ import annotations

from functools import lru_cache

import jinja2

from bapipe import hls_templates as templates

#: the generic modules every project gets, one per file
GENERIC = ("axis_fifo", "axis_width_conv", "axis_relu", "axis_gate", "swg",
           "pool_unit", "tm_sequencer", "ddr_weights", "axis_batchnorm", "axis_fork", "axis_add")
#: the board-to-board transport's modules (codegen.design.links), written when a plan has a link
TRANSPORT = ("net_pack", "net_tx", "net_send", "net_channel", "net_rx", "net_unpack", "net_recv", "net_link",
             "net_duplex")
GENERATOR_VERSION = "0.1.0"


@lru_cache(maxsize=1)
def rtl_env() -> jinja2.Environment:
    """The Jinja environment for Verilog templates (delimiters that never clash with Verilog)."""
    from bapipe.names import shown

    env = jinja2.Environment(
        loader=templates.loader("rtl"),
        block_start_string="[%", block_end_string="%]",
        variable_start_string="[@", variable_end_string="@]",
        comment_start_string="[#", comment_end_string="#]",
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined, autoescape=False,
    )
    env.filters["shown"] = shown   # a model's own names in comments and strings (bapipe.names)
    return env


def render_template(name: str, plan_hash: str = "none", **ctx) -> str:
    """Render ``hls_templates/rtl/<name>.v.j2`` with a file header naming the plan."""
    return rtl_env().get_template(f"{name}.v.j2").render(version=GENERATOR_VERSION, plan_hash=plan_hash, **ctx)
