"""Off-chip weights of a time-multiplexed stage in the RTL (codegen.design.dataflow.WeightFetch,
ddr_weights.v, tm_sequencer waiting on it): the Design records the plan's weight placement
(fpga_models.allocate, never re-derived), its cycles include the fetches, and the RTL
measures them."""
from __future__ import annotations

import json

import pytest

#: an MLP whose 85,034 parameters exceed on-chip ROM (fpga_models.allocate.WEIGHT_ROM_LIMIT
#: 65,536): planned time-multiplexed on one U250 at --cap 0.005 (a 289,013-byte kernel share),
#: fc1's 65,536 weights (131 KB > a 72 KB tile) stream through a FIFO and fc2..fc4 take turns in
#: the ping-pong tile buffer, so a sample waits for fc2's 256-word fill
MLP = """\
name: weight-mlp
description: 256-input MLP with off-chip weights
input: [256]
layers:
  - {name: fc1, type: dense, units: 256}
  - {name: relu1, type: relu}
  - {name: fc2, type: dense, units: 32}
  - {name: relu2, type: relu}
  - {name: fc3, type: dense, units: 256}
  - {name: relu3, type: relu}
  - {name: fc4, type: dense, units: 10}
"""

#: a small turn that fetches a big matrix: fc2 (2,048 weights, 32 cycles of its own at the
#: planned 64 lanes) fetches fc3's 1,024 words; fc3's turn fetches fc4's 1,280; fc1 streams
#: 2,048 words beside its 1,024 cycles: at --cap 0.008 (a 462,422-byte share) every kind of
#: wait is on the turns (the plan adds 2,848 cycles a sample for them). At --cap 0.005..0.007 the
#: planner's plans of it are refused by gen (bram36 over the capped count: 15 > 12 at 0.005)
MLP2 = """\
name: weight-mlp2
description: MLP whose small turn fetches a big matrix
input: [256]
layers:
  - {name: fc1, type: dense, units: 256}
  - {name: relu1, type: relu}
  - {name: fc2, type: dense, units: 8}
  - {name: fc3, type: dense, units: 4096}
  - {name: relu3, type: relu}
  - {name: fc4, type: dense, units: 10}
"""


def _plan(tmp_path, text: str = MLP, cap: str = "0.005"):
    from bapipe.cli import main
    from bapipe.plan import load_plan
    from bapipe.fpga_models.plancheck import resolve

    (tmp_path / "model.yaml").write_text(text)
    path = tmp_path / "plan.yaml"
    assert main(["plan", str(tmp_path / "model.yaml"), "4xU250-ring", "--mode", "inference", "--cap", cap,
                 "--boards", "1", "-o", str(path), "--json"]) == 0
    plan = load_plan(path)
    model, cluster = resolve(plan, str(path))
    return path, plan, model, cluster


@pytest.mark.slow   # plans the MLP and lowers it in process: ~2.5 s of CPU, 6 s under load
def test_design_records_the_plans_weight_placement(tmp_path, capsys):
    """The lowering reads the plan's decision (fpga_models.allocate): fc1 streamed, fc2..fc4
    resident; fill 256 words (fc2's 8,192 16-bit weights), fc1's turn reads its 2,048 words,
    fc2's fetches fc3's 256, fc3's fc4's 80; every turn lasts at least its fetch + the
    sequencer's lag, the first adds the fill, and the stage's job is the plan's forward
    cycles per sample (fill included: 2,646 + 256 = 2,902) within the lags."""
    import bapipe.codegen.design.dataflow as rm
    from bapipe.fpga_models.allocate import kernel_onchip_budget, tm_weight_cycles, tm_weight_turns
    from bapipe.fpga_models.boards import get_board

    _path, plan, model, cluster = _plan(tmp_path)
    capsys.readouterr()
    [ps] = plan.stages
    assert ps.style == "time-multiplexed"
    wf = rm.offchip_weights(plan, ps, model, cluster)
    layers = [model.layers[model.index[n]] for n in ps.layers]
    fold = {n: (f.pe, f.simd) if f.lanes is None else (1, f.lanes) for n, f in ps.folding.items()}
    board = get_board("U250")
    budget = kernel_onchip_budget(board, plan.utilisation_cap, plan.chunks, False)
    assert wf.budget == budget == 289_013
    assert (wf.fill, wf.fetch) == tm_weight_turns(layers, fold, "fixed16", budget) \
        == (256, {"fc1": 2_048, "fc2": 256, "fc3": 80})
    assert [(n, r) for n, _e, r in wf.tiles] == [("fc1", False), ("fc2", True), ("fc3", True), ("fc4", True)]
    # the fill's 256 words and the sequencer's WEIGHT_FILL_LAG (engines, the RTL's and the plan's rule)
    assert wf.plan_cycles == tm_weight_cycles(layers, board, fold, "fixed16", plan.utilisation_cap, plan.chunks,
                                              False) == 256 + rm.WEIGHT_FILL_LAG
    pipe = rm.build_pipeline(plan, model, cluster)
    [st] = pipe.stages
    assert st.weights == wf
    for u in st.units:
        assert u.cycles >= wf.fetch.get(u.layer, 0) + (rm.WEIGHT_TURN_LAG if u.layer in wf.fetch else 0)
    assert st.units[0].layer == "fc1" and st.units[0].cycles >= 2_048 + 256 + rm.WEIGHT_FILL_LAG
    plan_fwd = ps.cycles["fwd_interval"]
    assert plan_fwd == 2_915
    # the Design also counts one cycle of fill per width converter between turns (5 here: relu1,
    # fc2, relu2, relu3 and fc4 each take one cycle more than the plan's turn), measured in
    # Verilator (7ceca0f); the plan does not price them yet (docs/STATUS.md)
    wcs = sum(1 for b in st.blocks if b.kind == "width_conv")
    assert wcs == 5 and st.job_cycles - plan_fwd == wcs, (st.job_cycles, plan_fwd)   # 2,920
    # without the fetches the job would be 256 cycles (8.8%) short of the plan
    from bapipe.codegen.design.record import design_dict
    d = design_dict(pipe, plan)
    rec = d["stages"][0]["weights"]
    assert rec["fill_words"] == 256 and rec["fetch_words"] == {"fc1": 2_048, "fc2": 256, "fc3": 80}
    assert rec["plan_cycles"] == 256 + rm.WEIGHT_FILL_LAG and rec["budget_bytes"] == 289_013
    # the board's fetch engine gets the same words: the turns' and then the stage's fill
    from bapipe.codegen.rtl.pipeline import render_pipeline
    top = render_pipeline(pipe, plan.cluster, "x")["fpga0_top.v"]
    assert "ddr_weights #(" in top and ".FILL(1'h1)" in top


@pytest.mark.slow   # plans the MLP and lowers it in process: ~2.5 s of CPU
def test_turns_wait_on_their_fetches(tmp_path, capsys):
    """weight-mlp2 (MLP2): fill 64 words (fc2's 2,048 weights); fc1's streamed 2,048 words,
    fc2's fetch of fc3 (1,024) and fc3's of fc4 (1,280) each outlast the turn's own cycles, so
    those turns last fetch + WEIGHT_TURN_LAG, the first adds the fill; the Design's stage is the
    plan's 5,079 cycles a sample within 0.1% (the RTL's turns of the other layers are a few
    cycles off the plan's own, as without off-chip weights). 5,079, not 4,960: the frames are
    kept on chip by blocks (fpga_models.allocate.tm_onchip_blocks), and at cap 0.008 the
    kernel's share is 5 URAM and 18 BRAM18, which the packed weight buffer alone (20 URAM)
    exceeds: every frame goes off chip, 119 cycles of transfers beyond the turns'."""
    import bapipe.codegen.design.dataflow as rm

    _path, plan, model, cluster = _plan(tmp_path, MLP2, "0.008")
    capsys.readouterr()
    [ps] = plan.stages
    [st] = rm.build_pipeline(plan, model, cluster).stages
    wf = st.weights
    assert (wf.fill, wf.fetch, wf.plan_cycles) == (64, {"fc1": 2_048, "fc2": 1_024, "fc3": 1_280}, 2_836)
    turns = {u.layer: u.cycles for u in st.units}
    assert turns["fc2"] == 1_024 + rm.WEIGHT_TURN_LAG and turns["fc3"] == 1_280 + rm.WEIGHT_TURN_LAG
    assert turns["fc1"] == 64 + rm.WEIGHT_FILL_LAG + 2_048 + rm.WEIGHT_TURN_LAG
    assert ps.cycles["fwd_interval"] == 5_079
    # 0.1%: the few cycles above (fills and the sequencer's switch, priced otherwise by the plan);
    # the fetches are whole words on both sides
    assert abs(st.job_cycles / ps.cycles["fwd_interval"] - 1) <= 0.001, st.job_cycles


@pytest.mark.verilator
@pytest.mark.soak   # plans and builds one Verilator model of an MLP (~70 s compile under load): make test-all
@pytest.mark.parametrize("text, cap, planned", [(MLP, "0.005", 2_915), (MLP2, "0.008", 5_079)],
                         ids=["fill", "turns-wait"])
def test_rtl_waits_on_offchip_weights_and_meets_the_plan(tmp_path, capsys, text, cap, planned):
    """`bapipe gen` + `bapipe rtlsim --json` of the plans above: outputs bit-exact (0 LSB), the
    stage's measured cycles per sample within 2% of the plan's. Measured 2026-11-24: weight-mlp
    2,907 vs plan 2,902 (+0.17%; the RTL without the weight fetches ran 2,648: -8.8%);
    weight-mlp2 4,960 vs plan 4,962 (-0.04%). 35-38 s each with a cold Verilator build."""
    from bapipe.cli import main

    path, plan, _model, _cluster = _plan(tmp_path, text, cap)
    build = tmp_path / "build"
    assert main(["gen", str(path), "-o", str(build), "--json", "--allow-rule-violations"]) == 0
    capsys.readouterr()
    design = json.loads((build / "design.json").read_text())
    assert design["stages"][0]["weights"]["fill_words"] > 0
    assert main(["rtlsim", str(build), "--samples", "4", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    [row] = got["stages"]
    assert got["outputs_match"] and got["max_abs_err_lsb"] == 0
    assert row["plan_cycles_per_sample"] == plan.stages[0].cycles["fwd_interval"] == planned
    # 2%: the agreement bound of issue 15 (codegen.cli_gen.CYCLE_WARN); without the fetches
    # weight-mlp would be -8.8% and weight-mlp2 -57% (2,848 of 4,962 cycles are waits)
    assert abs(got["plan_error"]) <= 0.02, got
