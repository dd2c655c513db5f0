"""The errors of the toolkit: one base type, BapipeError, whose ``str()`` is the one line the
CLI prints and whose ``exit_code`` is the CLI's exit status; SpecError is bad input (exit 2)."""
from __future__ import annotations


class BapipeError(Exception):
    """Every error the Python API (bapipe.api) raises on purpose: ``str(err)`` is one line.

    Subclasses: SpecError (bad input, exit 2), host.backends.BackendUnavailable (a missing
    tool or board, exit 2), host.driver.PipelineFailure (a board worker failed, exit 1) and
    host.driver.TrainingDiverged (the loss became NaN, exit 1).
    """

    #: the `bapipe` command's exit status for this error
    exit_code = 1


class SpecError(BapipeError):
    """Bad user input: formats as ``FILE:LINE: FIELD: what was expected``.

    The CLI catches it, prints ``str(err)`` on stderr and exits with code 2.
    """

    exit_code = 2

    def __init__(self, file: str | None, line: int | None, field: str | None, expected: str):
        self.file = file or "command line"
        self.line = line
        self.field = field or "(document)"
        self.expected = expected
        super().__init__(self.format())

    def format(self) -> str:
        """The one-line message shown to the user."""
        loc = f"{self.file}:{self.line}" if self.line else f"{self.file}"
        msg = " ".join(str(self.expected).split())  # always one line
        fld = " ".join(str(self.field).split()) or repr(self.field)
        return f"{loc}: {fld}: {msg}"
