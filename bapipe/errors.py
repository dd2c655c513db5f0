"""One error type for every kind of bad input, printed as one line by the CLI."""
from __future__ import annotations


class SpecError(Exception):
    """Bad user input: formats as ``FILE:LINE: FIELD: what was expected``.

    The CLI catches it, prints ``str(err)`` on stderr and exits with code 2.
    """

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
