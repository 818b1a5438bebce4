"""How `ratchet api` is served in production, through a real process: from several worker
processes (`--workers N`), behind a proxy that serves it under a path and strips that path before
forwarding (`--root-path`), here a proxy of the test's own."""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urljoin

import httpx2 as httpx
import pytest

from orchestrator.settings import Settings
from orchestrator.testing.waiting import wait_until
from tests.conftest import make_settings
from tests.integration.test_api import AGENT, JSON, start_api
from workers.cli.commands import main


@pytest.fixture
def settings(redis_url: str, tmp_path: Path) -> Settings:
    return make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url)


class StripPrefix(BaseHTTPRequestHandler):
    """A proxy serving the API under PREFIX: the prefix is stripped before forwarding, and the
    answer comes back as the API gave it (redirects are not followed)."""

    PREFIX = "/ratchet"
    upstream = ""

    def _forward(self) -> None:
        if not self.path.startswith(self.PREFIX):
            self.send_error(404)
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        answer = httpx.request(
            self.command, self.upstream + (self.path[len(self.PREFIX) :] or "/"), content=body, headers=headers
        )
        self.send_response(answer.status_code)
        for name, value in answer.headers.items():
            if name.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_GET = do_POST = _forward

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@contextmanager
def proxy_to(upstream: str) -> Iterator[str]:
    """A StripPrefix proxy in front of `upstream`, on a free port: its URL."""
    handler = type("Proxy", (StripPrefix,), {"upstream": upstream})
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}"
    finally:
        proxy.shutdown()
        proxy.server_close()
        thread.join(10)


def test_two_worker_processes_serve_the_api_behind_a_proxy_that_strips_its_root_path(
    settings: Settings, tmp_path: Path
) -> None:
    server = start_api(settings, tmp_path / "api.log", "--workers", "2", "--root-path", "/ratchet/")
    try:
        # Given the two worker processes uvicorn started, each with its app up (the port takes
        # connections once they listen)
        def workers() -> list[int] | None:
            log = server.log.read_text()
            pids = [int(p) for p in re.findall(r"Started server process \[(\d+)\]", log)]
            return pids if len(set(pids)) == 2 and log.count("Application startup complete.") == 2 else None

        pids = wait_until(workers, 60, what="two worker processes to start")
        assert server.proc.pid not in pids
        with proxy_to(server.url) as proxy, httpx.Client(base_url=proxy, timeout=30) as http:
            # The prefix alone leads to the run pages under it, and their files load from there
            for entry in ("/ratchet", "/ratchet/ui"):
                assert http.get(entry).headers["location"] == "/ratchet/ui/", entry
            page = http.get("/ratchet/ui/")
            assert page.status_code == 200
            for linked in re.findall(r'(?:href|src)="([^"#:]+)"', page.text):
                assert http.get(urljoin("/ratchet/ui/", linked)).status_code == 200, linked
            # The docs load the schema through the proxy, and the schema says where the API is
            docs = http.get("/ratchet/docs")
            schema_url = re.search(r"url: '([^']+)'", docs.text)
            assert schema_url and schema_url[1] == "/ratchet/openapi.json", docs.text
            assert http.get(schema_url[1]).json()["servers"] == [{"url": "/ratchet"}]
            # A start's Location is a URL the client can follow through the proxy
            run = http.post("/ratchet/runs", json={"agent": AGENT, "input": "hi"}, headers=JSON)
            assert run.status_code == 202 and run.headers["location"] == f"/ratchet/runs/{run.json()['run_id']}"
            assert http.get(run.headers["location"]).json()["run_id"] == run.json()["run_id"]

            # When either worker is stopped, the other answers every request alone, a start
            # included (its app imported the agents of --app itself); the proxy connects anew each time
            for paused in pids:
                os.kill(paused, signal.SIGSTOP)
                try:
                    body = {"agent": AGENT, "input": "hi"}
                    starts = [http.post("/ratchet/runs", json=body, headers=JSON).status_code for _ in range(3)]
                    assert starts == [202, 202, 202], paused
                finally:
                    os.kill(paused, signal.SIGCONT)
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text()


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--workers", "0", "give a number of processes, 1 or more, not '0'"),
        ("--root-path", "ratchet", "give the path the proxy serves the API under, such as /ratchet, not 'ratchet'"),
    ],
)
def test_a_bad_workers_or_root_path_is_a_usage_error_saying_what_to_give(
    option: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["api", "--app", "tests.integration.compose_agents", option, value])
    assert exited.value.code == 2 and says in capsys.readouterr().err
