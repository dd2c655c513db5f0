"""The xrt host brings up the XUP VNx network layer of every cabled QSFP28 port (its IP, MAC,
gateway, socket table, ARP) before the first transfer, checked call by call against the
recording fake (tests/fake_pyxrt.py), whose networklayer keeps its own copy of VNx's register
map (xrt_host_api/include/vnx/networklayer.hpp) and answers ARP only between ports whose
addresses share a /24."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import fake_pyxrt
from handplan import hand_plan
from test_xrt_backend import _gen, _inference, _program, _run


def _ip_writes(calls, dev, inst):
    return {c[3]: c[4] for c in calls if c[0] == "ip_write" and c[1:3] == (dev, inst)}


def test_every_vnx_port_is_addressed_before_the_first_transfer(tmp_path, monkeypatch):
    plan = _inference(hand_plan("tiny-cnn", cuts=(1, 3, 5)))
    out, model, stamp = _gen(tmp_path, plan)
    r, calls = _run(monkeypatch, plan, model, out, stamp)
    assert r["mismatches_vs_numpy"] == 0
    import json
    placement = json.loads((out / "placement.json").read_text())
    ports = [(stamp_b["device"], stamp_b["name"], p["qsfp"], p["towards"])
             for stamp_b in stamp["xrt"]["boards"] for p in placement["boards"][stamp_b["name"]]["network"]
             if p["stack"] == "vnx"]
    assert len(ports) == 6   # the 3 links a 4-stage pipeline cables, 2 ends each
    first_start = next(i for i, c in enumerate(calls) if c[0] in ("start", "sync"))
    last_ip = max(i for i, c in enumerate(calls) if c[0].startswith("ip"))
    assert last_ip < first_start   # every register written before any kernel runs or buffer moves
    dev_of = {name: dev for dev, name, _, _ in ports}
    seen_ips = set()
    for dev, name, q, peer in ports:
        w = _ip_writes(calls, dev, f"networklayer_{q}")
        ip, gw = w[0x18], w[0x1C]
        assert gw == (ip & 0xFFFFFF00) + 1                        # VNx's gateway rule
        mac = (w[0x14] << 32) | w[0x10]
        assert mac >> 40 == 0x02 and mac & 0xFF == ip & 0xFF      # locally administered, host byte = IP's
        assert w[0x990] == 1 and w[0x890] == w[0x910] == 62781    # socket 0 valid, VNx's UDP port
        assert all(w[0x990 + 8 * i] == 0 for i in range(1, 16))   # the other 15 sockets invalid
        # socket 0 points at the peer's port that faces this one, in the same /24
        back = [qq for d, n, qq, pp in ports if n == peer and pp == name]
        peer_ips = {_ip_writes(calls, dev_of[peer], f"networklayer_{qq}")[0x18] for qq in back}
        assert w[0x810] in peer_ips and (w[0x810] >> 8) == (ip >> 8) and w[0x810] != ip
        arp = [c[4] for c in calls if c[0] == "ip_write" and c[1:4] == (dev, f"networklayer_{q}", 0x1010)]
        assert arp == [0, 1, 0]
        seen_ips.add(ip)
    assert len(seen_ips) == 6   # one address per port


def test_a_networklayer_with_another_register_map_is_refused(tmp_path, monkeypatch):
    """A networklayer built from a VNx release whose UDP table is elsewhere reads 0 sockets at
    0xa10: the host says so in one line instead of writing addresses into the wrong registers."""
    from bapipe.host.backends import BackendUnavailable, xrt_net

    plan = _inference(hand_plan("tiny-cnn", cuts=(1, 3, 5)))
    out, model, stamp = _gen(tmp_path, plan)
    fake = fake_pyxrt.make(4)
    fake.state["nets"].update({(d, f"networklayer_{q}"): {} for d in range(4) for q in range(2)})

    class Bd:
        def __init__(self, i):
            self.device = fake.device(i)
            self.uuid = self.device.load_xclbin(fake.xclbin(str(out / "Makefile")))
    boards = {f"fpga{i}": Bd(i) for i in range(4)}
    with pytest.raises(BackendUnavailable, match="0xa10"):
        xrt_net.bring_up(fake, out, boards)
    assert not [c for c in fake.calls if c[0] == "ip_write"]   # nothing written blind


def test_a_peer_that_does_not_answer_arp_is_named(tmp_path, monkeypatch):
    """Two ends put in different /24s (as a mis-cabled link would look) get no ARP answer."""
    from bapipe.host.backends import BackendUnavailable, xrt_net

    plan = _inference(hand_plan("tiny-cnn", cuts=(1, 3, 5)))
    out, model, stamp = _gen(tmp_path, plan)
    real = xrt_net.addresses
    monkeypatch.setattr(xrt_net, "addresses", lambda p: {k: ({**v, "ip": v["ip"] ^ (1 << 16)} if k == ("fpga0", 0)
                                                             else v) for k, v in real(p).items()})
    fake = fake_pyxrt.make(4)

    class Bd:
        def __init__(self, i):
            self.device = fake.device(i)
            self.uuid = self.device.load_xclbin(fake.xclbin(str(out / "Makefile")))
    with pytest.raises(BackendUnavailable, match="no ARP answer"):
        xrt_net.bring_up(fake, out, {f"fpga{i}": Bd(i) for i in range(4)})


def test_link_cfg_free_running_clock_per_platform():
    """VNx post_sys_link.tcl: U280 -> clk_gt_freerun, U250 -> ii_level1_wire, U50/U55C -> ii_level0_wire."""
    from bapipe.codegen.design.netnames import platform_gt

    assert platform_gt("U250", 0)[2] == "ii_level1_wire/ulp_m_aclk_freerun_ref_00"
    assert platform_gt("U280", 1)[2] == "clk_gt_freerun"
    assert platform_gt("U55C", 0)[2] == platform_gt("U50", 0)[2] == "ii_level0_wire/ulp_m_aclk_freerun_ref_00"
