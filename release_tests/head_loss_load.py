"""An open-loop load on several listeners for ``release_tests.head_loss``: requests are
sent on a fixed schedule (GET and POST in turn), each in its own thread, so a stalled
listener does not slow the others' offered load; each result is booked to the phase it was
sent in and to its listener."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict


class OpenLoop:
    def __init__(self, urls: list[str], rate: float) -> None:
        self._urls, self._interval = urls, 1.0 / rate
        self._phase = "before"
        self._sent: dict[str, Counter] = defaultdict(Counter)
        self._failed: dict[str, Counter] = defaultdict(Counter)
        self._errors: Counter = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for url in self._urls:
            thread = threading.Thread(target=self._drive, args=(url,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def phase(self, name: str) -> None:
        self._phase = name

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        time.sleep(6)  # the last requests' answers (5 s timeout)

    def _drive(self, url: str) -> None:
        next_at, n = time.monotonic(), 0
        while not self._stop.is_set():
            threading.Thread(target=self._one, args=(url, n % 2 == 1, self._phase),
                             daemon=True).start()
            n += 1
            next_at += self._interval
            time.sleep(max(0.0, next_at - time.monotonic()))

    def _one(self, url: str, post: bool, phase: str) -> None:
        listener = url.split("//")[1].split(":")[0]
        try:
            request = urllib.request.Request(url, data=b"x" if post else None)
            with urllib.request.urlopen(request, timeout=5) as reply:
                ok, why = reply.status == 200, str(reply.status)
        except urllib.error.HTTPError as e:
            ok, why = False, str(e.code)
        except Exception as e:  # refused, reset, timed out
            ok, why = False, type(e).__name__
        with self._lock:
            self._sent[phase][listener] += 1
            if not ok:
                self._failed[phase][listener] += 1
                self._errors[f"{phase} {listener} {'POST' if post else 'GET'} {why}"] += 1

    def sent(self) -> dict:
        return {p: dict(c) for p, c in self._sent.items()}

    def failed(self) -> dict:
        return {p: {ip: self._failed[p].get(ip, 0) for ip in self._sent[p]} for p in self._sent}

    def errors(self) -> dict:
        return dict(self._errors)
