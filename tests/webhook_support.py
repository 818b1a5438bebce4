"""A webhook receiver for tests: a real HTTP server on a free port of 127.0.0.1 that records each
POST and can fail the first ones; and settings that sign deliveries and allow that address."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from orchestrator.settings import Settings

SECRET = "whsec-test-0123456789abcdef"


class Receiver:
    """An HTTP server that records each POST and answers the first `failures` with `failing`."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.failures = 0
        self.failing = 500
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((dict(self.headers.items()), body))
                status = 200
                if receiver.failures > 0:
                    receiver.failures -= 1
                    status = receiver.failing
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/ratchet?src=test"

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.requests]


@contextmanager
def receiving() -> Iterator[Receiver]:
    """A `Receiver` serving on a free port of 127.0.0.1 for the block."""
    r = Receiver()
    thread = threading.Thread(target=r.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()
        thread.join(5)


def hook_settings(database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = dict(
        database_url=database_url,
        sqlite_synchronous="NORMAL",
        dispatcher="orchestrator.testing:InMemoryDispatcher",
        webhook_secret=SECRET,
        webhook_allow="127.0.0.1",
        webhook_backoff_seconds=10.0,
        webhook_max_attempts=3,
    )
    return Settings(**{**values, **overrides})
