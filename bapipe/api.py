"""bapipe's Python API: the same code the `bapipe` commands run, called from Python.

    >>> import bapipe
    >>> p = bapipe.plan("vgg16", "4xU250-ring")          # zoo/built-in names, files or loaded objects
    >>> p.result.iteration_time_s, p.result.speedup_vs_data_parallel
    >>> p.save("plan.yaml"); s = p.simulate(); p.gantt("vgg16.png")
    >>> b = p.generate("build/")                          # -> Build: .csim(), .rtlsim(), .synth()
    >>> r = bapipe.run(p, backend="numpy", epochs=1)

Options are the commands' options with ``_`` for ``-`` (``global_batch=64``, ``no_replication=
True``); their defaults are the commands' (bapipe.options), so ``bapipe.plan(m, c)`` and
``bapipe plan M C`` make the same plan. Results are dataclasses (bapipe.results) whose fields
are the keys of the command's ``--json``. Every error is a :class:`BapipeError` whose ``str()``
is the one line the command prints; bad input is its subclass ``SpecError``.

The CLI calls this module (:func:`invoke`), so a command and its Python call are one code path.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .errors import BapipeError, SpecError
from .results import (CsimResult, GenResult, PlanResult, ProfileResult, RtlsimResult, RunResult, SimResult,
                      SynthResult)

__all__ = ["plan", "load_plan", "load_model", "load_cluster", "profile", "run", "Plan", "Build", "StageTime",
           "BapipeError", "SpecError"]

#: API keyword -> the command's dest, where the Python name reads better than the dest
_ALIASES = {"profile": "measured"}


def _options(command: str, given: dict, positional: tuple[str, ...] = ()) -> SimpleNamespace:
    """The command's options: its CLI defaults (bapipe.options) overridden by ``given``. An
    unknown keyword is refused in one line naming it and the known ones."""
    from .options import actions, convert

    known = actions(command)
    for k in positional + ("json", "output", "force"):
        known.pop(k, None)
    opts = {k: a.default for k, a in known.items()}
    for key, value in given.items():
        dest = _ALIASES.get(key, key)
        if dest not in known:
            raise SpecError(None, None, key, f"expected an option of {command} "
                                             f"({', '.join(sorted({_back(k) for k in known}))})")
        try:   # the parser's types, bounds and choices, as for typed text
            opts[dest] = convert(known[dest], value)
        except ValueError as e:
            raise SpecError(None, None, key, str(e)) from None
    return SimpleNamespace(**opts)


def _back(dest: str) -> str:
    return next((k for k, v in _ALIASES.items() if v == dest), dest)


def _ref(obj) -> str:
    """The name a plan file records for a loaded model or cluster (its zoo/built-in name or the
    file it came from), so the plan reloads it."""
    src = getattr(obj, "source", None)
    return obj.name if src in (None, "zoo", "builtin") else str(src)


def load_model(model, opaque: dict | None = None):
    """A model: a zoo name, a .yaml/.onnx path, or a loaded Model (returned as is).
    ``opaque``: ONNX op -> (fwd_s, bwd_s) for ops the toolkit cannot price."""
    from .models import load_model as _load
    from .spec import Model

    if isinstance(model, Model):
        return model
    if not isinstance(model, (str, Path)):
        raise SpecError(None, None, "model", f"expected a zoo name, a .yaml/.onnx path or a Model, got "
                                             f"{type(model).__name__}")
    return _load(str(model), opaque=opaque)


def load_cluster(cluster):
    """A cluster: a built-in name, a .yaml path, or a loaded Cluster (returned as is)."""
    from bapipe.fpga_models.cluster import Cluster, load_cluster as _load

    if isinstance(cluster, Cluster):
        return cluster
    if not isinstance(cluster, (str, Path)):
        raise SpecError(None, None, "cluster", f"expected a built-in name, a .yaml path or a Cluster, got "
                                               f"{type(cluster).__name__}")
    return _load(str(cluster))


@dataclass
class StageTime:
    """One stage of a plan's breakdown: where its time per micro-batch goes (seconds, the
    planner's prediction) and its memory per board."""

    stage: int
    layers: tuple[int, int]
    boards: list[str]
    style: str
    fwd_s: float
    bwd_s: float
    send_s: float
    allreduce_s: float
    time_s: float
    memory_bytes: int
    share: float   # time_s over the slowest stage's: 1.0 is the bottleneck


@dataclass
class Plan:
    """A plan with its model and cluster loaded: what `bapipe plan` writes, in memory.

    ``spec`` is the plan file's dataclass (bapipe.plan.Plan); ``result`` the `plan --json`
    figures (None for a plan loaded from a file, whose prediction is ``spec.predicted``);
    ``path`` the file it was loaded from or last saved to."""

    spec: Any
    model: Any
    cluster: Any
    result: PlanResult | None = None
    path: Path | None = None
    _text: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        it = (self.result.iteration_time_s if self.result else self.spec.predicted.get("iteration_time_s"))
        from .units import seconds
        return (f"<bapipe.Plan {self.spec.model} on {self.spec.cluster}: {len(self.spec.stages)} stages, "
                f"{self.spec.schedule}, {self.spec.microbatches} micro-batches, "
                f"{seconds(it) if it else '?'} per iteration>")

    def save(self, path, force: bool = False) -> Path:
        """Write the plan file (YAML); an existing file is replaced only with ``force``."""
        return self._save(path, force, "path")

    def _save(self, path, force: bool, option: str) -> Path:
        path = Path(path)
        if not str(path).strip():
            raise SpecError(None, None, option, "expected a file name, got an empty string")
        if path.is_file() and not force:
            raise SpecError(str(path), None, option, "expected a new file: it exists (add --force to overwrite it)")
        try:
            self.spec.save(path)
        except OSError as e:
            raise SpecError(str(path), None, option, f"cannot write the plan: {e.strerror or e}") from None
        self.path, self._text = path, None
        if self.result is not None:
            self.result.set("output", str(path))
        return path

    @property
    def _file(self) -> str:
        """How errors name this plan: its file, else <plan>."""
        return str(self.path) if self.path else "<plan>"

    def simulate(self, iterations: int = 1, gantt=None, trace=None) -> SimResult:
        """Replay the plan's schedule event by event (`bapipe sim`); ``gantt``/``trace``: files to
        write (a .png/.pdf/.svg chart, needs the ``plot`` extra; a Chrome trace .json)."""
        from bapipe.fpga_models.cli_sim import sim_result

        return SimResult.from_json(sim_result(self.spec, self.model, self.cluster, self._file, iterations,
                                              None if gantt is None else str(gantt),
                                              None if trace is None else str(trace)))

    def gantt(self, path, iterations: int = 1) -> Path:
        """Write the simulated schedule as a Gantt chart (.png, .pdf or .svg); needs ``plot``."""
        return Path(self.simulate(iterations, gantt=path).gantt)

    def breakdown(self) -> list[StageTime]:
        """Per stage: forward, backward, send and all-reduce time per micro-batch and memory, with
        its share of the slowest stage's time (the planner's prediction)."""
        slow = max((s.time_s for s in self.spec.stages), default=0.0) or 1.0
        return [StageTime(s.index, (s.first, s.last), list(s.boards), s.style, s.fwd_s, s.bwd_s, s.send_s,
                          s.allreduce_s, s.time_s, s.memory_bytes, s.time_s / slow) for s in self.spec.stages]

    def generate(self, path, engines: str = "hls", force: bool = False,
                 allow_rule_violations: bool = True) -> "Build":
        """Generate the HLS/RTL project into folder ``path`` (`bapipe gen`); returns its Build.
        `bapipe check`'s physical rules run on it: a board that breaks one is reported (stderr and
        ``Build.result.check``); with ``allow_rule_violations=False`` (`gen --strict-rules`) such a
        build is refused and nothing is written."""
        from bapipe.codegen.cli_gen import generate_folder

        text = self._text if self._text is not None else self.spec.dumps()
        res = generate_folder(self.spec, self.model, self.cluster, path, text, self._file, engines, force,
                              allow_rule_violations)
        return Build(Path(path), GenResult.from_json(res))

    def show(self) -> str:
        """The table `bapipe plan` prints."""
        from bapipe.planner.cli_plan import show_plan

        return show_plan(self.result.to_json() if self.result else {})


def plan(model, cluster, **options) -> Plan:
    """Plan ``model`` on ``cluster`` (`bapipe plan`): names, files or loaded objects; options as
    the command's (``schedule``, ``microbatches``, ``global_batch``, ``mode``, ``format``,
    ``optimizer``, ``cap``, ``no_replication``, ``whole_blocks``, ``boards``, ``placements``,
    ``pareto``, ``partition``, ``cost_model``, ``profile``, ``opaque``, ``mesh``). Nothing is
    written: :meth:`Plan.save` writes the file."""
    from bapipe.planner.cli_plan import model_opaque, plan_outcome

    args = _options("plan", options, ("model", "cluster"))
    m = load_model(model, opaque=model_opaque(args) or None)
    c = load_cluster(cluster)
    model_ref = str(model) if isinstance(model, (str, Path)) else _ref(m)
    cluster_ref = str(cluster) if isinstance(cluster, (str, Path)) else _ref(c)
    out, res = plan_outcome(m, c, model_ref, cluster_ref, args)
    return Plan(out.plan, m, c, PlanResult.from_json(res))


def load_plan(path) -> Plan:
    """A plan file written by `bapipe plan` (or :meth:`Plan.save`), checked in full against
    its model and cluster, which are loaded with it."""
    from bapipe.fpga_models.plancheck import resolve

    from .plan import load_plan as _load

    spec = _load(str(path))
    model, cluster = resolve(spec, str(path))
    return Plan(spec, model, cluster, None, Path(path), Path(path).read_text(encoding="utf-8"))


def _as_plan(p) -> Plan:
    if isinstance(p, Plan):
        return p
    if isinstance(p, (str, Path)):
        return load_plan(p)
    raise SpecError(None, None, "plan", f"expected a bapipe.Plan or a plan file, got {type(p).__name__}")


def profile(model, cluster, **options) -> ProfileResult:
    """Per-layer counts and cost of ``model`` on each board type of ``cluster`` (`bapipe
    profile`); options ``format``, ``batch``, ``profile`` (measured times), ``opaque``."""
    from bapipe.fpga_models.cli_info import check_profile_options, profile_result
    from bapipe.planner.cli_plan import model_opaque

    args = _options("profile", options, ("model", "cluster"))
    check_profile_options(args.format, args.batch)
    m = load_model(model, opaque=model_opaque(args) or None)
    return ProfileResult.from_json(profile_result(m, load_cluster(cluster), args.format, args.batch, args.measured))


@dataclass
class Build:
    """A project folder written by `bapipe gen` (or :meth:`Plan.generate`); ``result``: what
    gen reported (None for a folder opened with ``Build(path)``)."""

    path: Path
    result: GenResult | None = None

    def __post_init__(self):
        self.path = Path(self.path)

    def csim(self, **options) -> CsimResult:
        """g++ C-simulation of every stage against numpy (`bapipe csim`); ``iterations=K`` runs
        K training iterations against fpga_models.train_fixed. Needs the ``csim`` extra."""
        return CsimResult.from_json(self._call("csim", "cmd_csim", options)[0])

    def rtlsim(self, **options) -> RtlsimResult:
        """Verilator run of the generated pipeline (`bapipe rtlsim`). Needs the ``sim`` extra."""
        return RtlsimResult.from_json(self._call("rtlsim", "cmd_rtlsim", options)[0])

    def synth(self, **options) -> SynthResult:
        """yosys synth_xilinx per board (`bapipe synth`). Needs the ``synth`` extra."""
        return SynthResult.from_json(self._call("synth", "cmd_synth", options)[0])

    def _call(self, command: str, handler: str, options: dict) -> tuple[dict, int]:
        import importlib

        _require(command, options)
        args = _options(command, options, ("build",))
        args.build = str(self.path)
        return importlib.import_module(f"bapipe.codegen.cli_{command}").__dict__[handler](args)


def _require(command: str, options: dict) -> None:
    """The extra a command needs, refused in one line when missing (bapipe.extras)."""
    from .extras import require

    if command == "csim":
        require("csim", "bapipe csim")
    elif command == "rtlsim":
        engine = options.get("engine", "cpp")
        require("sim", "bapipe rtlsim", ("verilator", "cocotb", "cocotbext.axi") if engine == "cocotb"
                else ("verilator",))
    elif command == "synth":
        require("synth", "bapipe synth")
    elif command == "run":
        if options.get("backend") == "verilator":
            require("sim", "bapipe run --backend verilator", ("verilator",))
        if options.get("ray"):
            require("ray", "bapipe run --ray")


def run(plan, backend: str = "numpy", **options) -> RunResult:
    """Run the plan's schedule on a backend (`bapipe run`): ``numpy`` trains on the digits,
    ``verilator`` trains on the generated training RTL, ``xrt`` runs the generated forward pass.
    Options as the command's (``epochs``, ``lr``, ``lr_schedule``, ``precision``, ``seed``,
    ``ray``, ``build``, ...). A failed run raises BapipeError (its ``exit_code`` says why)."""
    from bapipe.host.cli_run import run_result

    _require("run", {**options, "backend": backend})
    args = _options("run", {**options, "backend": backend}, ("plan",))
    p = _as_plan(plan)
    args.plan = str(p.path) if p.path is not None else p.spec   # a file is checked in full on load
    return RunResult.from_json(run_result(args))


def invoke(command: str, args) -> tuple[dict, int]:
    """The `bapipe` CLI's call into this API for ``command`` with its parsed ``args``: the
    --json object and the exit status."""
    opts = {k: v for k, v in vars(args).items() if k not in ("command", "json")}
    if command == "plan":
        p = plan(opts.pop("model"), opts.pop("cluster"), **_drop(opts, "output", "force"))
        p._save(args.output, True, "-o")   # cli checked -o before planning (--force)
        return p.result.to_json(), 0
    if command == "profile":
        return profile(opts.pop("model"), opts.pop("cluster"), **_alias(_drop(opts, "output", "force"))).to_json(), 0
    if command == "sim":
        return load_plan(args.plan).simulate(args.iterations, args.gantt, args.trace).to_json(), 0
    if command == "gen":
        strict = getattr(args, "strict_rules", False)
        if strict and getattr(args, "allow_rule_violations", False):
            raise SpecError(None, None, "--strict-rules", "expected --strict-rules or --allow-rule-violations, not both")
        b = load_plan(args.plan).generate(args.output, args.engines, args.force, not strict)
        return b.result.to_json(), 0
    if command in ("csim", "rtlsim", "synth"):
        b = Build(opts.pop("build"))
        res, rc = b._call(command, f"cmd_{command}", opts)
        return res, rc
    if command == "run":
        try:
            return run(opts.pop("plan"), **opts).to_json(), 0
        except BapipeError as e:
            if isinstance(e, SpecError):
                raise
            sys.stderr.write(f"bapipe run: {e}\n")
            return {"backend": args.backend, "error": str(e)}, e.exit_code
    raise SpecError(None, None, "COMMAND", f"expected a command of the API, got {command!r}")


def _drop(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


def _alias(d: dict) -> dict:
    """dests -> API keywords (``measured`` -> ``profile``)."""
    back = {v: k for k, v in _ALIASES.items()}
    return {back.get(k, k): v for k, v in d.items()}


#: commands the CLI runs through :func:`invoke`
COMMANDS = ("plan", "profile", "sim", "gen", "csim", "rtlsim", "synth", "run")
