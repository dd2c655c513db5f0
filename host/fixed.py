"""The plan's number format as a round-trip on float32 arrays (fake quantisation).

Fixed-point formats (fixed16, int8) use fpga_models.fixedpoint's quantize/dequantize, the
same rounding (AP_RND) and saturation (AP_SAT) the HLS kernels and RTL use; fp16 and bf16
round through their bit layouts; fp32 is the identity. Training with these rounds weights
and activations in the forward pass and lets gradients pass straight through -- except
fixed16, which has integer training arithmetic (:class:`FixedTraining`): the numpy backend
then computes exactly what the hardware computes (fpga_models.train_fixed).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from bapipe.errors import SpecError


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (round to nearest even on the dropped 16 bits)."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


class FixedTraining:
    """Integer training in the plan's fixed-point format (fpga_models.train_fixed, docs/training.md).

    Returned by :func:`make_quant` for formats that have training arithmetic (fixed16): the
    numpy backend then trains with raw integers exactly as the hardware does. Calling it
    still rounds a float array to the activation format (fake quantisation), for callers
    that only need that.
    """

    def __init__(self, number_format: str):
        from bapipe.fpga_models import train_fixed as T

        self.number_format = number_format
        self.tf = T.get_formats(number_format)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        from bapipe.fpga_models import fixedpoint as fx

        return fx.dequantize(fx.quantize(x, self.tf.act), self.tf.act).astype(np.float32)


#: the number format integer arrays in the host mean (the only one with training arithmetic)
INT_TRAIN_FORMAT = "fixed16"


def int_formats():
    """The training formats of integer (raw fixed-point) host arrays."""
    from bapipe.fpga_models import train_fixed as T

    return T.get_formats(INT_TRAIN_FORMAT)


def make_quant(number_format: str) -> Callable[[np.ndarray], np.ndarray] | None:
    """A function rounding float32 arrays to ``number_format``, or None for fp32; for a
    format with integer training arithmetic (fixed16), a :class:`FixedTraining`."""
    if number_format == "fp32":
        return None
    if number_format == "fp16":
        return lambda x: np.asarray(x, np.float32).astype(np.float16).astype(np.float32)
    if number_format == "bf16":
        return _bf16
    try:
        from bapipe.fpga_models import fixedpoint as fx
    except ImportError:  # the fixed-point reference is another helper's module
        raise SpecError(None, None, "--precision", "fixed-point mode needs fpga_models/fixedpoint.py, "
                                                   "which is not installed; use --precision float32") from None
    from bapipe.fpga_models import train_fixed as T

    if number_format in T.TRAIN_FORMATS:
        return FixedTraining(number_format)
    try:
        fmt = fx.get_fmt(number_format)
    except ValueError as e:
        raise SpecError(None, None, "number_format", str(e)) from None
    return lambda x: fx.dequantize(fx.quantize(x, fmt), fmt).astype(np.float32)
