"""Which local address and interface reach a peer: what a host advertises to other hosts.

A host's name is a poor guide (containers and fake hosts often resolve it to 127.0.0.1, and
torch.distributed's gloo then advertises loopback to other hosts), so the address is taken from
the route the kernel would use to reach the controller.
"""

from __future__ import annotations

import fcntl
import socket
import struct

_SIOCGIFADDR = 0x8915


def split_host_port(text: str, default_port: int | None = None) -> tuple[str, int]:
    """``"tcp://10.0.0.1:29500"``, ``"10.0.0.1:29500"`` or ``"name:29500"`` -> (host, port)."""
    rest = text.removeprefix("tcp://")
    host, sep, port = rest.rpartition(":")
    if not sep:
        if default_port is None:
            raise ValueError(f"{text!r} has no port; write HOST:PORT, e.g. 10.0.0.1:29500")
        return rest, default_port
    if not host or not port.isdigit():
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. tcp://10.0.0.1:29500)")
    return host, int(port)


def source_address(host: str, port: int) -> str:
    """The local IPv4 address the kernel would send from to reach ``host:port``."""
    ip = socket.gethostbyname(host)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((ip, port))  # UDP: picks a route, sends nothing
        return str(s.getsockname()[0])


def interface_of(ip: str) -> str | None:
    """The name of the interface that holds ``ip`` (for GLOO_SOCKET_IFNAME), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(
                    s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode())
                )
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == ip:
                return name
    return None


def is_wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "*")
