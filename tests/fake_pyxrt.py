"""A recording stand-in for XRT's ``pyxrt`` module, injected through ``sys.modules``.

It implements the calls host/backends/xrt_backend.py makes (device, xclbin, load_xclbin,
kernel, group_id, bo, write/read/sync, run, set_arg, start, wait) with the signatures of
XRT's Python binding, refuses the misuses a real board would (a kernel on a device whose
xclbin does not hold it, a buffer read before it was synced from the device, an xclbin
path that does not exist, a device opened twice), and records every call as a tuple in
``calls`` for the tests to check against the build's manifest.

The boards' data path is a function given by the test: ``program(raw) -> bytes`` is called
when an s2mm run is waited for, with the bytes given to the mm2s mover that feeds it (the
one on the same device, else the only one: a chain of boards), and returns what that s2mm
writes.
"""
from __future__ import annotations

import types
from pathlib import Path


class XrtMisuse(AssertionError):
    """The backend used pyxrt in a way a real board would refuse."""


def make(n_devices: int, program=None):
    """A fresh fake module with ``n_devices`` boards."""
    m = types.ModuleType("pyxrt")
    calls: list[tuple] = []
    state = {"opened": set(), "mm2s": {}, "s2mm": {}, "program": program}
    m.calls = calls
    m.state = state

    class xclBOSyncDirection:  # noqa: N801 (pyxrt's spelling)
        XCL_BO_SYNC_BO_TO_DEVICE = "to_device"
        XCL_BO_SYNC_BO_FROM_DEVICE = "from_device"

    class ert_cmd_state:  # noqa: N801
        ERT_CMD_STATE_COMPLETED = "completed"

    class xclbin:  # noqa: N801
        def __init__(self, path: str):
            if not Path(path).is_file():
                raise XrtMisuse(f"xclbin {path} does not exist")
            self.path = path
            calls.append(("xclbin", path))

    class device:  # noqa: N801
        def __init__(self, index: int):
            if not 0 <= index < n_devices:
                raise XrtMisuse(f"device {index} of {n_devices}")
            if index in state["opened"]:
                raise XrtMisuse(f"device {index} opened twice")
            state["opened"].add(index)
            self.index = index
            self.loaded = None
            calls.append(("device", index))

        def load_xclbin(self, xb):
            self.loaded = xb.path
            calls.append(("load_xclbin", self.index, xb.path))
            return ("uuid", self.index, xb.path)

    class kernel:  # noqa: N801
        def __init__(self, dev, uuid, name: str):
            if uuid != ("uuid", dev.index, dev.loaded):
                raise XrtMisuse(f"kernel {name}: uuid of another device or xclbin")
            self.device = dev
            self.name = name
            self.kernel_name, inst = name.split(":")
            self.instance = inst.strip("{}")
            calls.append(("kernel", dev.index, name))

        def group_id(self, arg: int) -> int:
            return arg

    class bo:  # noqa: N801
        normal = "normal"

        def __init__(self, dev, nbytes: int, flags, group: int):
            self.device = dev
            self.data = bytearray(nbytes)
            self.synced_from = False
            calls.append(("bo", dev.index, nbytes, group))

        def write(self, data, offset: int):
            self.data[offset:offset + len(data)] = data
            calls.append(("bo.write", self.device.index, len(data)))

        def sync(self, direction, nbytes: int, offset: int):
            if nbytes > len(self.data):
                raise XrtMisuse(f"sync of {nbytes} bytes on a {len(self.data)}-byte buffer")
            if direction == xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE:
                self.synced_from = True
            calls.append(("bo.sync", self.device.index, direction, nbytes))

        def read(self, nbytes: int, offset: int):
            if not self.synced_from:
                raise XrtMisuse("buffer read before it was synced from the device")
            return bytes(self.data[offset:offset + nbytes])

    class run:  # noqa: N801
        def __init__(self, k):
            self.kernel = k
            self.args: dict[int, object] = {}

        def set_arg(self, index: int, value):
            self.args[index] = value
            calls.append(("set_arg", self.kernel.device.index, self.kernel.instance, index,
                          ("bo", len(value.data)) if isinstance(value, bo) else value))

        def start(self):
            k = self.kernel
            calls.append(("start", k.device.index, k.instance))
            if k.kernel_name == "mm2s":
                state["mm2s"][(k.device.index, k.instance)] = bytes(self.args[0].data)
            elif k.kernel_name == "s2mm":
                state["s2mm"][(k.device.index, k.instance)] = self.args[1]

        def wait(self, ms: int):
            k = self.kernel
            calls.append(("wait", k.device.index, k.instance))
            if k.kernel_name == "s2mm" and state["program"] is not None:
                same = [v for (d, _), v in state["mm2s"].items() if d == k.device.index]
                feeds = same or list(state["mm2s"].values())
                if len(feeds) != 1:
                    raise XrtMisuse(f"{k.instance}: {len(feeds)} input movers could feed it")
                target = state["s2mm"][(k.device.index, k.instance)]
                data = state["program"](feeds[0])
                if len(data) != len(target.data):
                    raise XrtMisuse(f"{k.instance}: program wrote {len(data)} bytes, buffer holds {len(target.data)}")
                target.data[:] = data
            return ert_cmd_state.ERT_CMD_STATE_COMPLETED

    def enumerate_devices():
        return [object() for _ in range(n_devices)]

    # A VNx networklayer behind pyxrt.ip: its AXI-lite registers, written here as XUP VNx
    # xrt_host_api/include/vnx/networklayer.hpp lays them out (the fake's own copy of the map, so
    # the host's is checked against it): 16 sockets (VNx's build default); an ARP discovery
    # (a 0 -> 1 write at 0x1010) fills the table with every other networklayer in the same /24
    # that has its IP set (the fake's boards are all cabled), entry = the IP's last octet, the
    # address stored first octet lowest, valid flags one byte per entry from 0x1100.
    nets: dict[tuple[int, str], dict[int, int]] = {}
    state["nets"] = nets

    class ip:  # noqa: N801
        def __init__(self, dev, uuid, name: str):
            if uuid != ("uuid", dev.index, dev.loaded):
                raise XrtMisuse(f"ip {name}: uuid of another device or xclbin")
            kname, inst = name.split(":")
            if kname != "networklayer":
                raise XrtMisuse(f"ip {name}: only networklayer instances have registers here")
            self.key = (dev.index, inst.strip("{}"))
            nets.setdefault(self.key, {0xA10: 16})
            calls.append(("ip", dev.index, self.key[1]))

        def read_register(self, offset: int) -> int:
            calls.append(("ip_read", *self.key, offset))
            return nets[self.key].get(offset, 0)

        def write_register(self, offset: int, value: int):
            if not 0 <= int(value) < 1 << 32:
                raise XrtMisuse(f"{self.key}: register 0x{offset:x} is 32 bits, got {value}")
            regs = nets[self.key]
            if offset == 0x1010 and value == 1 and regs.get(0x1010, 0) == 0:
                mine = regs.get(0x18, 0)
                for other, oregs in nets.items():
                    theirs = oregs.get(0x18, 0)
                    if other != self.key and theirs and mine and (theirs >> 8) == (mine >> 8):
                        i = theirs & 0xFF
                        regs[0x1400 + 4 * i] = int.from_bytes(theirs.to_bytes(4, "big"), "little")
                        w = 0x1100 + (i // 4) * 4
                        regs[w] = regs.get(w, 0) | (1 << (8 * (i % 4)))
            regs[offset] = int(value)
            calls.append(("ip_write", *self.key, offset, int(value)))

    for obj in (xclBOSyncDirection, ert_cmd_state, xclbin, device, kernel, bo, run, enumerate_devices, ip):
        setattr(m, obj.__name__, obj)
    return m
