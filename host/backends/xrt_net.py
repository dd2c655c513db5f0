"""Bring up the XUP VNx network layer of every QSFP28 port before the first transfer.

A VNx ``networklayer`` kernel (UDP/IP, ARP, ICMP over the CMAC) drops every packet until the
host has given it an address and a socket table; nothing in the bitstream does. Per board and
per QSFP28 port whose stack is ``vnx`` (build/placement.json, ``network``: the port, the board it
faces), through pyxrt's ``ip(device, uuid, "networklayer:{networklayer_<q>}")`` and its
``read_register`` / ``write_register``:

1. read ``udp_number_sockets`` (a map that does not match the linked networklayer reads 0 or
   garbage there: refused rather than written blindly);
2. write the port's MAC (48 bits over two words), IPv4 address and gateway;
3. write socket 0 (the framing kernel sends with TDEST 0): the peer port's IPv4 address, the
   UDP ports on both ends, valid; every other socket invalid;
4. once every port has its address: ARP discovery on every port (write 0, 1, 0), then read the
   ARP table back and refuse a port whose peer did not answer.

Register map: XUP VNx ``xrt_host_api/include/vnx/networklayer.hpp`` (mac_address 0x0010,
ip_address 0x0018, gateway 0x001C, arp_discovery 0x1010, arp_valid 0x1100, arp_ip_addr 0x1400,
udp_theirIP 0x810, udp_theirPort 0x890, udp_myPort 0x910, udp_valid 0x990, udp_number_sockets
0xa10; sockets 8 bytes apart, ARP valid flags one byte per entry) and its
``src/networklayer.cpp`` (gateway = the /24's .1; ARP discovery as 0, 1, 0). Earlier VNx releases
put the UDP table at 0x2010.. and ARP at 0x3010: rebuild networklayer.xo from the release the map
names, or the step-1 check refuses. UDP port 62781: VNx's socket default.

Addresses: each cabled link gets its own /24, 10.1.<link>.0, its two ends .10 and .11 (.1 is
VNx's gateway); MACs are locally administered, 02:00:0a:01:<link>:<host>.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import BackendUnavailable

MAC_LSB, MAC_MSB, IP_ADDRESS, GATEWAY = 0x0010, 0x0014, 0x0018, 0x001C
ARP_DISCOVERY, ARP_VALID, ARP_IP = 0x1010, 0x1100, 0x1400
UDP_THEIR_IP, UDP_THEIR_PORT, UDP_MY_PORT, UDP_VALID, UDP_SOCKETS = 0x810, 0x890, 0x910, 0x990, 0xA10
SOCKET_STRIDE = 8
#: most sockets a VNx networklayer is built with (its default is 16); more means a wrong map
MAX_SOCKETS = 256
UDP_PORT = 62781
ARP_ENTRIES = 256


def networklayer_instance(qsfp: int) -> str:
    """VNx's networklayer instance of QSFP28 port ``qsfp`` (codegen.design.netnames.vnx_netlayer_instance)."""
    return f"networklayer_{qsfp}"


def addresses(placement: dict) -> dict[tuple[str, int], dict]:
    """(board, qsfp) -> {ip, mac, gateway, peer_ip} of every VNx port, from build/placement.json."""
    ends = {}
    for name, b in sorted(placement.get("boards", {}).items()):
        for p in b.get("network", []):
            if p.get("stack") == "vnx":
                ends[(name, int(p["qsfp"]))] = p["towards"]
    links, out = {}, {}
    for (name, q), peer in sorted(ends.items()):
        back = next((k for k, v in sorted(ends.items()) if k[0] == peer and v == name and k not in links.values()
                     and k != (name, q)), None)
        if back is None or (name, q) in links.values():
            continue
        links[(name, q)] = back
    for k, ((a, back)) in enumerate(sorted(links.items())):
        for host, (end, other) in ((10, (a, back)), (11, (back, a))):
            ip = (10 << 24) | (1 << 16) | (k << 8) | host
            out[end] = {"ip": ip, "gateway": (ip & 0xFFFFFF00) + 1,
                        "mac": (0x02000A01 << 16) | (k << 8) | host, "peer": other}
    for end in out:
        out[end]["peer_ip"] = out[out[end]["peer"]]["ip"]
    return out


def dotted(ip: int) -> str:
    """10.1.0.10 for 0x0A01000A."""
    return ".".join(str((ip >> s) & 0xFF) for s in (24, 16, 8, 0))


def bring_up(pyxrt, build: Path, boards: dict) -> list[dict]:
    """Program every VNx port of ``boards`` (board name -> an opened board with ``device`` and
    ``uuid``); returns what was written, one entry per port. BackendUnavailable on a port whose
    map or peer does not answer."""
    path = Path(build) / "placement.json"
    try:
        placement = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []    # no network section: a build without boards to cable (one board, or RTL only)
    plan = {k: v for k, v in addresses(placement).items() if k[0] in boards}
    ips, done = {}, []
    for (name, q), a in sorted(plan.items()):
        bd = boards[name]
        ip = pyxrt.ip(bd.device, bd.uuid, f"networklayer:{{{networklayer_instance(q)}}}")
        ips[(name, q)] = ip
        n = int(ip.read_register(UDP_SOCKETS))
        if not 1 <= n <= MAX_SOCKETS:
            raise BackendUnavailable(f"backend xrt: {name} {networklayer_instance(q)} reads {n} sockets at "
                                     f"0x{UDP_SOCKETS:x}: its register map is not VNx networklayer.hpp's "
                                     "(rebuild networklayer.xo from that release)")
        ip.write_register(MAC_LSB, a["mac"] & 0xFFFFFFFF)
        ip.write_register(MAC_MSB, a["mac"] >> 32)
        ip.write_register(IP_ADDRESS, a["ip"])
        ip.write_register(GATEWAY, a["gateway"])
        for i in range(n):
            off = i * SOCKET_STRIDE
            ip.write_register(UDP_THEIR_IP + off, a["peer_ip"] if i == 0 else 0)
            ip.write_register(UDP_THEIR_PORT + off, UDP_PORT if i == 0 else 0)
            ip.write_register(UDP_MY_PORT + off, UDP_PORT if i == 0 else 0)
            ip.write_register(UDP_VALID + off, 1 if i == 0 else 0)
        done.append({"board": name, "qsfp": q, "ip": dotted(a["ip"]), "peer": dotted(a["peer_ip"]), "sockets": n})
    for key in sorted(ips):   # every address is set: now each port can answer the others' ARP
        for v in (0, 1, 0):
            ips[key].write_register(ARP_DISCOVERY, v)
    for (name, q), ip in sorted(ips.items()):
        if not _arp_has(ip, plan[(name, q)]["peer_ip"]):
            raise BackendUnavailable(f"backend xrt: {name} QSFP28 {q}: no ARP answer from "
                                     f"{dotted(plan[(name, q)]['peer_ip'])} (cable, CMAC link or the peer's "
                                     "networklayer)")
    return done


def swap32(v: int) -> int:
    """The four bytes of ``v`` reversed: the ARP table keeps an address first octet lowest
    (VNx networklayer.cpp read_arp_table byte-swaps it to print it)."""
    return int.from_bytes(int(v).to_bytes(4, "big"), "little")


def _arp_has(ip, peer_ip: int) -> bool:
    """The ARP table holds ``peer_ip`` in a valid entry (valid flags: byte i % 4 of word i // 4)."""
    valid = 0
    for i in range(ARP_ENTRIES):
        if i % 4 == 0:
            valid = int(ip.read_register(ARP_VALID + (i // 4) * 4))
        if (valid >> ((i % 4) * 8)) & 1 and int(ip.read_register(ARP_IP + 4 * i)) == swap32(peer_ip):
            return True
    return False
