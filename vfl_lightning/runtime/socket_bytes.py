"""Bytes on this process's TCP sockets to given peers, as the kernel counts them (Linux): each
socket's ``tcpi_bytes_acked`` (sent and acknowledged) plus ``tcpi_bytes_received`` from
``TCP_INFO``, so TLS records, HTTP/2 frames and gRPC headers are all in. The sockets are found
through /proc/self/fd and /proc/self/net/tcp{,6}. Elsewhere :meth:`SocketBytes.total` is None."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from pathlib import Path

BYTES_ACKED_OFFSET = 120
"""Offset of ``tcpi_bytes_acked`` (then ``tcpi_bytes_received``) in Linux's ``struct tcp_info``
(since Linux 4.1/4.2)."""
TCP_INFO_SIZE = 136


def _proc_addresses(line: str) -> tuple[tuple[str, int], tuple[str, int], int] | None:
    """(local, remote, inode) of one line of /proc/net/tcp or tcp6."""
    parts = line.split()
    if len(parts) < 10 or ":" not in parts[1]:
        return None

    def address(text: str) -> tuple[str, int]:
        host, port = text.split(":")
        raw = bytes.fromhex(host)
        # the kernel prints each 32-bit word in host byte order (little-endian here)
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
        ip = ipaddress.ip_address(words)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return str(ip), int(port, 16)

    return address(parts[1]), address(parts[2]), int(parts[9])


def peer_inodes(peers: set[tuple[str, int]]) -> set[int]:
    """Inodes of this process's TCP sockets whose remote end is one of ``peers`` (ip, port)."""
    inodes = set()
    for name in ("tcp", "tcp6"):
        path = Path("/proc/self/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            found = _proc_addresses(line)
            if found is not None and found[1] in peers:
                inodes.add(found[2])
    return inodes


def socket_fds(inodes: set[int]) -> list[int]:
    fds = []
    for entry in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.startswith("socket:[") and int(target[8:-1]) in inodes:
            fds.append(int(entry.name))
    return fds


def tcp_bytes(fd: int) -> int | None:
    """Bytes sent (acknowledged) plus received on TCP socket ``fd``."""
    try:
        duplicate = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        info = duplicate.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_SIZE)
    except OSError:
        return None
    finally:
        duplicate.close()
    if len(info) < BYTES_ACKED_OFFSET + 16:
        return None
    acked, received = struct.unpack_from("<QQ", info, BYTES_ACKED_OFFSET)
    return acked + received


def resolve(address: str) -> set[tuple[str, int]]:
    """Every (ip, port) ``host:port`` resolves to."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return set()
    found = set()
    for info in infos:
        ip = ipaddress.ip_address(info[4][0].split("%")[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        found.add((str(ip), int(port)))
    return found


class SocketBytes:
    """The bytes on this process's sockets to ``addresses`` (``host:port`` strings)."""

    def __init__(self, addresses: list[str]) -> None:
        self.peers: set[tuple[str, int]] = set()
        for address in addresses:
            self.peers |= resolve(address)
        self.available = hasattr(socket, "TCP_INFO") and Path("/proc/self/net/tcp").exists()

    def total(self) -> int | None:
        """Bytes on every open socket to the peers, or None where the kernel does not say."""
        if not self.available:
            return None
        counts = [tcp_bytes(fd) for fd in socket_fds(peer_inodes(self.peers))]
        if any(count is None for count in counts):
            return None
        return sum(counts)
