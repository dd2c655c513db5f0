"""The one exception of the lowering: the plan needs what the generated hardware cannot build."""


class Unsupported(Exception):
    """The plan uses something the RTL pipeline cannot build (message says what)."""
