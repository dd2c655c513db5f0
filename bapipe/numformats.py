"""The one number-format table: every plan ``number_format``, its storage and, for the
fixed-point ones, the bits the kernels compute in.

Everything else derives from it: plan validation (``bapipe.plan.FORMATS``), memory and
link bytes (``fpga_models.boards.bytes_per_element``), the fixed-point reference and the
HLS/RTL types (``fpga_models.fixedpoint.FORMATS``: fixed16 follows hls4ml's default
``ap_fixed<16,6>``, https://fastmachinelearning.org/hls4ml/ "Configuration"), the
training formats (``fpga_models.train_fixed``) and the HLS type names
(``codegen.design.context.format_ctx``). Per-format DSP costs are board facts
(``fpga_models.boards``), not format facts.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NumberFormat:
    """``width`` bits an element; ``frac`` fraction bits of a fixed-point format (None for
    floating point, which the FPGA kernels do not generate)."""

    name: str
    width: int
    frac: int | None = None

    @property
    def bytes(self) -> int:
        """Storage bytes of one element."""
        return self.width // 8

    @property
    def fixed(self) -> bool:
        return self.frac is not None


NUMBER_FORMATS: dict[str, NumberFormat] = {f.name: f for f in (
    NumberFormat("fixed16", 16, 10),
    NumberFormat("int8", 8, 4),
    NumberFormat("fp16", 16),
    NumberFormat("bf16", 16),
    NumberFormat("fp32", 32),
)}

#: the plan's ``number_format`` names, in the order the CLI lists them
FORMATS: tuple[str, ...] = tuple(NUMBER_FORMATS)
