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


def test_boards_peak_is_the_rate_of_the_format_in_use():
    """`boards` shows each board's peak at the default format (fixed16) as the planner prices
    it: 2 OP a DSP MAC on the U250 (11,520 usable DSP x 300 MHz = 6.91 TOP/s); the GPUs, which
    have no fixed16 datapath, at fp16 (cost.gpu_format), where the table showed "0 OP/s"."""
    from bapipe.fpga_models.cli_info import cmd_boards, show_boards

    rows = {line.split("│")[1].strip(): line for line in show_boards(cmd_boards(None)).splitlines()
            if line.startswith("│")}
    assert rows["U250"].rstrip(" │").endswith("6.91 TOP/s")
    assert rows["V100"].rstrip(" │").endswith("125 TFLOP/s (fp16)")   # V100 data sheet: 125 TFLOPS tensor
    assert rows["A100"].rstrip(" │").endswith("312 TFLOP/s (fp16)")
    assert not any(" 0 OP/s" in r for r in rows.values())


def test_gen_summary_prints_no_raw_floats():
    """`gen` of the default vgg16 plan printed its cycles as "3.86438e+06" beside "3.86436e+06":
    whole cycles with separators now (the values of that build's stage 3), a fraction below 100."""
    from bapipe.codegen.cli_gen import show_gen

    r = {"files": 135, "output": "b", "format": "fixed16", "fingerprint": "e6cfe9f016a7" * 2, "rtl_files": 63,
         "skipped": [], "stages": [
             {"name": "stage3", "layers": 8, "weights": 123642856, "design_cycles_per_sample": 3864380.0,
              "plan_fwd_cycles_per_sample": 3864360.4, "boards": ["fpga3"]},
             {"name": "stage0", "layers": 10, "weights": 2482, "design_cycles_per_sample": 64.0,
              "plan_fwd_cycles_per_sample": 64.5, "boards": ["fpga0"]}]}
    rows = show_gen(r).splitlines()[2:4]
    assert rows[0].split() == ["stage3", "8", "123,642,856", "3,864,380", "3,864,360", "fpga3"]
    assert rows[1].split() == ["stage0", "10", "2,482", "64", "64.5", "fpga0"]
    assert "e+" not in show_gen(r)


def test_rtlsim_summary_counts_cycles_readably():
    """rtlsim of vgg16 printed "3526157 cycles at 15364 cycles/s"."""
    from bapipe.codegen.cli_rtlsim import show_rtlsim

    r = {"boards": ["fpga0"], "stage_boards": ["fpga0"], "samples": 3, "outputs_match": True, "max_abs_err_lsb": 0,
         "cycles_per_sample": 64.0, "predicted_cycles_per_sample": 64.0, "error": 0.0, "bottleneck": "stage0",
         "steady_state_cycles_per_sample": 64, "latency_cycles": 300, "sim_cycles": 3526157,
         "sim_cycles_per_s": 15364.2, "compile_s": 1.5, "overflow": False}
    line = next(x for x in show_rtlsim(r).splitlines() if "simulation" in x)
    assert line.split(":", 1)[1].strip() == "3,526,157 cycles at 15.4k cycles/s (compile 1.5 s)"


def test_counts_are_singular_for_one():
    from bapipe.units import count
    assert count(1, "micro-batch") == "1 micro-batch" and count(8, "micro-batch") == "8 micro-batches"
    assert count(1, "stage") == "1 stage" and count(0, "stage") == "0 stages"
