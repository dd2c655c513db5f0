"""What every xrt run shares: pyxrt (the real one or a recording fake), a build's xrt manifest
and one opened board (device, xclbin, kernels)."""
from __future__ import annotations

from pathlib import Path

from . import BackendUnavailable

WAIT_MS = 60_000


def _pyxrt():
    try:
        import pyxrt  # noqa: F401  (ships with XRT: source /opt/xilinx/xrt/setup.sh)
    except ImportError:
        raise BackendUnavailable("backend xrt: pyxrt is not importable (install XRT and "
                                 "`source /opt/xilinx/xrt/setup.sh`); no Alveo board can be driven here") from None
    return pyxrt


def read_manifest(build: Path, plan) -> dict:
    """The build's ``xrt`` section (codegen.package.kernels.read_xrt_manifest: a build of this plan)."""
    from bapipe.codegen.package.kernels import read_xrt_manifest

    return read_xrt_manifest(build, plan.fingerprint())


class _Board:
    """One opened board: its device, the loaded xclbin's uuid, and its manifest entry."""

    def __init__(self, pyxrt, build: Path, entry: dict):
        self.entry = entry
        self.device = pyxrt.device(entry["device"])
        self.uuid = self.device.load_xclbin(pyxrt.xclbin(str(build / entry["xclbin"])))

    def kernel(self, pyxrt, name: str, instance: str):
        return pyxrt.kernel(self.device, self.uuid, f"{name}:{{{instance}}}")
