"""bapipe.units: what people read (IEC bytes, engineering notation), on the figures the issue
quoted as hard to read."""
from __future__ import annotations

from bapipe.units import nbytes, seconds, si


def test_bytes_are_iec():
    assert nbytes(97_225_728) == "92.7 MiB"          # `plan` printed this as "92.7MB"
    assert nbytes(64 * 2**30) == "64 GiB"            # `boards` printed the U250's DDR as "68.7GB"
    assert nbytes(512) == "512 B" and nbytes(1536) == "1.5 KiB" and nbytes(None) == "-"


def test_engineering_notation():
    assert seconds(3.14038e-05) == "31.4 us"          # was "3.14038e-05 s"
    assert si(1.019e06, "samples/s") == "1.02M samples/s"   # was "1.019e+06 samples/s"
    assert seconds(0.386547557) == "387 ms"           # was "386547.557 us"
    assert si(2.5e8, "Hz") == "250 MHz" and si(6.912e12, "FLOP/s") == "6.91 TFLOP/s"
    assert seconds(1500) == "1500 s" and seconds(0) == "0 s" and seconds(999.96) == "1000 s"
    assert seconds(4.1e-9, 4) == "4.1 ns" and si(73.0) == "73"
