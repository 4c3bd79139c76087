"""A small HTTP server on 127.0.0.1 for the probes' tests (no Ray): ``answer(request)``
gives each GET's (status, body); ``request`` is the handler, with its ``headers``."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


def http_server(answer: Callable[[BaseHTTPRequestHandler], tuple[int, bytes]]
                ) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answer(self)
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
