"""Bytes this process moved over TCP (every socket: gloo pairs and the c10d store), read
from the kernel's per-socket counters (``TCP_INFO``: ``tcpi_bytes_sent``, Linux >= 5.5, and
``tcpi_bytes_received``), so a test can measure what a collective really sent and received.

Example:
    >>> before = tcp_counters()
    >>> dist.all_reduce(tensor)
    >>> sent, received = moved(before)
"""

from __future__ import annotations

import os
import socket
import struct

_RECEIVED = 128  # offset of tcpi_bytes_received in struct tcp_info
_SENT = 200  # offset of tcpi_bytes_sent


def tcp_counters() -> dict[str, tuple[int, int]]:
    """Per TCP socket of this process (by inode): bytes sent and received so far."""
    out: dict[str, tuple[int, int]] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if not target.startswith("socket:"):
            continue
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (
                socket.AF_INET,
                socket.AF_INET6,
            ):
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            if len(info) >= _SENT + 8:
                sent = struct.unpack_from("Q", info, _SENT)[0]
                received = struct.unpack_from("Q", info, _RECEIVED)[0]
                out[target] = (sent, received)
        except OSError:
            pass
        finally:
            os.close(sock.detach())
    return out


def moved(before: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """Bytes sent and received since ``before`` (a :func:`tcp_counters` snapshot)."""
    sent = received = 0
    for key, (s, r) in tcp_counters().items():
        s0, r0 = before.get(key, (0, 0))
        sent += s - s0
        received += r - r0
    return sent, received
