"""Abusive HTTP clients for a listener's limits, and the normal client beside them.

Loopback only; each client is bounded in bytes and time and returns what it saw: the
status of the answer (None without one) and whether the listener closed the connection.
Used by ``test_http_abuse`` (a short burst) and ``release_tests/http_abuse`` (a longer one,
with figures). A client that sends a body watches for an early answer while it sends, as
RFC 9112 §9.5 asks; ``requests``-style clients that write everything first are covered
by ``body_with_requests``.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

import psutil
import requests

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Seen:
    status: int | None  # the answer's status; None when there was none
    closed: bool  # the listener closed the connection
    seconds: float  # from connecting to the end (the close, or giving up)


def _status(answer: bytes) -> int | None:
    parts = answer.split(b" ", 2)
    return int(parts[1]) if answer.startswith(b"HTTP/1.1 ") and len(parts) > 1 else None


def exchange(port: int, chunks: Iterator[bytes] | list[bytes], *, pause_s: float = 0.0,
             timeout_s: float = 10.0) -> Seen:
    """Send ``chunks`` (``pause_s`` apart), stopping at the first byte of an answer; then
    read until the listener closes or ``timeout_s`` passes."""
    started = time.monotonic()
    deadline = started + timeout_s
    with socket.create_connection((HOST, port), timeout=timeout_s) as sock:
        answer = b""
        try:
            for chunk in chunks:
                if select.select([sock], [], [], pause_s)[0] or time.monotonic() > deadline:
                    break  # answered early (or out of time): stop sending
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        closed = False
        while time.monotonic() < deadline:
            try:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                data = sock.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                closed = True
                break
            if not data:
                closed = True
                break
            answer += data
    return Seen(_status(answer), closed, time.monotonic() - started)


def declared_body(port: int, path: str, declared_bytes: int, send_bytes: int) -> Seen:
    """A body declared ``declared_bytes`` long; ``send_bytes`` of it sent unless answered."""
    head = (f"POST {path} HTTP/1.1\r\nhost: {HOST}\r\ncontent-length: {declared_bytes}\r\n"
            f"\r\n").encode()
    piece = b"x" * 65536
    return exchange(port, [head, *(piece for _ in range(send_bytes // len(piece)))])


def chunked_body(port: int, path: str, total_bytes: int) -> Seen:
    """A chunked body of ``total_bytes`` (no declared length), sent unless answered."""
    head = f"POST {path} HTTP/1.1\r\nhost: {HOST}\r\ntransfer-encoding: chunked\r\n\r\n"
    piece = b"10000\r\n" + b"y" * 65536 + b"\r\n"
    return exchange(port, [head.encode(), *(piece for _ in range(total_bytes // 65536))])


def huge_header(port: int, path: str, header_bytes: int) -> Seen:
    head = f"GET {path} HTTP/1.1\r\nhost: {HOST}\r\nx-huge: ".encode()
    piece = b"h" * 16384
    return exchange(port, [head, *(piece for _ in range(header_bytes // len(piece)))])


def malformed(port: int, garbage: bytes = b"\x16\x03\x01\x02\x00 NOT HTTP \x00\r\n\r\n") -> Seen:
    return exchange(port, [garbage])


def slowloris(port: int, path: str, byte_every_s: float, timeout_s: float) -> Seen:
    """A head sent one byte at a time, never finished (within ``timeout_s``)."""
    head = f"GET {path} HTTP/1.1\r\nhost: {HOST}\r\nx-slow: ".encode()
    return exchange(port, [head, *(b"s" for _ in range(100_000))], pause_s=byte_every_s,
                    timeout_s=timeout_s)


def slow_body(port: int, path: str, byte_every_s: float, timeout_s: float) -> Seen:
    """A whole head, then its declared body one byte at a time, never finished."""
    head = (f"POST {path} HTTP/1.1\r\nhost: {HOST}\r\ncontent-length: 100000\r\n"
            f"\r\n").encode()
    return exchange(port, [head, *(b"b" for _ in range(100_000))], pause_s=byte_every_s,
                    timeout_s=timeout_s)


def idle(port: int, timeout_s: float) -> Seen:
    """Connects and sends nothing."""
    return exchange(port, [], timeout_s=timeout_s)


def body_with_requests(url: str, size_bytes: int) -> int | str:
    """A body sent as ``requests`` does (all of it before reading): the status, or the
    error's name when the connection was reset under it."""
    try:
        return requests.post(url, data=b"z" * size_bytes, timeout=30).status_code
    except requests.RequestException as e:
        return type(e).__name__


@dataclass
class NormalClient:
    """Small POSTs in a loop on one kept connection until stopped; an answer is good
    when it is a 200 with the body's length."""

    url: str
    body: bytes = b"n" * 1024
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        session = requests.Session()
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                r = session.post(self.url, data=self.body, timeout=10)
                good = r.status_code == 200 and r.text == str(len(self.body))
            except requests.RequestException as e:
                good, r = False, e
            self.latencies_s.append(time.monotonic() - started)
            if good:
                self.ok += 1
            else:
                self.failures.append(repr(r)[:200])

    def stop(self) -> None:
        self._stop.set()

    @property
    def success(self) -> float:
        total = self.ok + len(self.failures)
        return self.ok / total if total else 0.0


def memory_mb(pid: int) -> dict[str, float]:
    """A process's resident memory in MiB: ``rss`` in all; ``shmem``, the shared-memory
    pages it touched (Ray's object store, where a request over 100 KiB goes on its way to
    the replica: the node's store owns and reuses them, bounded by its size);
    ``own`` = rss - shmem (its heap, stacks and code); ``uss``, the pages no other process
    shares."""
    with open(f"/proc/{pid}/status") as f:
        kib = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f)
               if k in ("VmRSS", "RssShmem")}
    uss = psutil.Process(pid).memory_full_info().uss
    return {"rss": kib["VmRSS"] / 1024, "shmem": kib["RssShmem"] / 1024,
            "own": (kib["VmRSS"] - kib["RssShmem"]) / 1024, "uss": uss / 2**20}
