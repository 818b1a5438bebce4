"""A scripted OpenAI-compatible HTTP server for tests, benchmarks and demos.

    with ScriptedServer(ScriptConfig(tool_batches=2)) as server:
        client = OpenAI(base_url=server.url, api_key="sk-test")

It serves Chat Completions (`POST /v1/chat/completions`), the Responses API (`POST /v1/responses`)
and `GET /v1/models`, answering as `orchestrator.testing.script.decide` says, with bodies built
from the openai package's types (`orchestrator.testing.replies`), and the APIs of `WIRES` (Anthropic's
`POST /v1/messages`: `orchestrator.testing.anthropic_wire`) and the Gemini API
(`orchestrator.testing.gemini_wire`); a request with `stream: true` gets server-sent events in
its API's format (`orchestrator.testing.streams`). Test hooks:
`GET|PUT /_script` reads or replaces the config (and resets fault budgets), `GET /_requests`
lists the requests served, `POST /_reset` clears that log and the fault budgets; in Python,
`holding` keeps calls in flight until the test releases them (`orchestrator.testing.holding`).

Run it as a process with `python -m orchestrator.testing.server [--host H] [--port N]
[--config JSON-or-@file]`; it prints `scripted model listening on <url>` once it accepts calls.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from pydantic import ValidationError

from orchestrator.testing.anthropic_wire import MessagesWire
from orchestrator.testing.conversation import last_user_text, output_format_name, request_conversation
from orchestrator.testing.gemini_wire import GeminiExchange, gemini_route
from orchestrator.testing.holding import Holding
from orchestrator.testing.replies import chat_completion, error_reply, model_list, response_object
from orchestrator.testing.script import (
    ScriptConfig,
    ScriptedError,
    ScriptedReply,
    ScriptState,
    conversation_key,
    decide,
    error_body,
)
from orchestrator.testing.streams import chat_chunks, error_event, response_events

#: The APIs besides OpenAI's, by name: each reads its requests and writes its answers.
WIRES = {wire.api: wire for wire in (MessagesWire(),)}
_ROUTES = {"/chat/completions": "chat", "/responses": "responses", **{w.path: w.api for w in WIRES.values()}}
RUN_ID_HEADER = "X-Ratchet-Run-Id"
STEP_HEADER = "X-Ratchet-Step"


class ScriptedServer:
    """The scripted model on a background thread; `url` is the base URL (ending in `/v1`)."""

    def __init__(self, config: ScriptConfig | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.state = ScriptState()
        #: Calls held in flight until the test releases them.
        self.holding = Holding()
        self._config = config or ScriptConfig()
        self._log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL for `OpenAI(base_url=...)` and OPENAI_BASE_URL."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def config(self) -> ScriptConfig:
        """The script in force."""
        with self._lock:
            return self._config

    def configure(self, config: ScriptConfig) -> None:
        """Replace the script and reset fault budgets (the request log is kept)."""
        with self._lock:
            self._config = config
        self.state.reset()

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A copy of the request log (api, model, turn, conversation_key, run_id, step, status...)."""
        with self._lock:
            return [dict(entry) for entry in self._log]

    def requests_for(self, run_id: str) -> list[dict[str, Any]]:
        """The logged requests of one run (its `X-Ratchet-Run-Id`), oldest first."""
        return [r for r in self.requests if r["run_id"] == run_id]

    def reset(self) -> None:
        """Clear the request log and the fault budgets, and let held calls go."""
        with self._lock:
            self._log.clear()
        self.state.reset()
        self.holding.release()

    def start(self) -> Self:
        """Bind and serve on a daemon thread; returns self."""
        if self._httpd is not None:
            return self
        self._httpd = _HTTPServer((self.host, self.port), _Handler, self)
        self.port = int(self._httpd.server_address[1])
        # A short poll interval makes stop() quick, which keeps test fixtures fast.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="scripted-model", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Bind and serve on the calling thread until interrupted (the CLI's foreground mode)."""
        self._httpd = _HTTPServer((self.host, self.port), _Handler, self)
        self.port = int(self._httpd.server_address[1])
        print(f"scripted model listening on {self.url}", flush=True)
        try:
            self._httpd.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            pass
        finally:
            self._httpd.server_close()
            self._httpd = None

    def stop(self) -> None:
        """Stop serving and release the port."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self.holding.release()
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def record(self, entry: dict[str, Any]) -> None:
        """Add a served request to the log `GET /_requests` reads (each API's wire calls it too)."""
        with self._lock:
            self._log.append(entry)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # Tests restart servers quickly; a port in TIME_WAIT must not fail the next bind.
    allow_reuse_address = True
    # Hundreds of concurrent clients (the concurrency benchmark) overflow socketserver's
    # default listen backlog of 5, and the kernel then resets their connections.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], owner: ScriptedServer) -> None:
        self.owner = owner
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet when a client hangs up mid-request (timeouts in tests do it on purpose)."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    # Keep-alive: the openai client reuses connections, and HTTP/1.0 would cost a connect per call.
    protocol_version = "HTTP/1.1"
    # Headers and body go out as two writes; with Nagle on, the second waits ~40 ms for an ACK.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: tests and benchmarks read `/_requests`, not stderr."""

    def do_GET(self) -> None:
        """Serve `/v1/models`, `/_script` and `/_requests`."""
        owner = self.server.owner
        path = self._path()
        if path == "/models":
            self.send_json(200, model_list(["scripted", *owner.config.by_model]))
        elif path == "/_script":
            self.send_json(200, owner.config.model_dump(mode="json"))
        elif path == "/_requests":
            self.send_json(200, owner.requests)
        else:
            self._send_error(404, f"no route GET {self.path}")

    def do_PUT(self) -> None:
        """Replace the script: `PUT /_script` with the config as JSON."""
        if self._path() != "/_script":
            self._send_error(404, f"no route PUT {self.path}")
            return
        body = self.read_json()
        if body is None:
            return
        try:
            config = ScriptConfig.model_validate(body)
        except ValidationError as exc:
            self._send_error(400, f"invalid script: {exc}")
            return
        self.server.owner.configure(config)
        self.send_json(200, config.model_dump(mode="json"))

    def do_POST(self) -> None:
        """Serve the two model APIs and `/_reset`."""
        if (gemini := gemini_route(self.path)) is not None:
            GeminiExchange(self, gemini).serve()  # the Gemini API (`orchestrator.testing.gemini_wire`)
            return
        path = self._path()
        if path == "/_reset":
            self._read_body()
            self.server.owner.reset()
            self.send_json(200, {"ok": True})
            return
        if path not in _ROUTES:
            self._read_body()
            self._send_error(404, f"no route POST {self.path}")
            return
        body = self.read_json()
        if body is None:
            return
        api = _ROUTES[path]
        try:
            self._answer(api, body)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            # A body of the wrong shape is the client's error: say so instead of dropping the connection.
            self._send_error(400, f"malformed {api} request: {type(exc).__name__}: {exc}")

    def _answer(self, api: str, body: dict[str, Any]) -> None:
        owner = self.server.owner
        model = str(body.get("model") or "scripted")
        wire = WIRES.get(api)
        conversation, tools = wire.conversation(body) if wire else request_conversation(api, body)
        run_id = self.headers.get(RUN_ID_HEADER)
        key = conversation_key(run_id, conversation)
        stream = body.get("stream") is True
        api_key = wire.api_key(self.headers) if wire else _bearer(self.headers.get("Authorization"))
        decision = decide(
            owner.config,
            owner.state,
            model=model,
            api_key=api_key,
            conversation=conversation,
            tools=tools,
            conversation_key=key,
            stream=stream,
        )
        # Logged on arrival, before any hold and the scripted delay: a test can then see a call in
        # flight, and a call whose client was killed while it waited still counts.
        owner.record(
            {
                "api": api,
                "model": model,
                "turn": decision.turn,
                "conversation_key": key,
                "run_id": run_id,
                "step": self.headers.get(STEP_HEADER),
                "status": decision.status if isinstance(decision, ScriptedError) else 200,
                "tool_calls": 0 if isinstance(decision, ScriptedError) else len(decision.tool_calls),
                "usage": None if isinstance(decision, ScriptedError) else dict(decision.usage),
                "stream": stream,
                # The request's parameter names (not their values): what the client sent besides the transcript.
                "params": sorted(k for k in body if k not in ("messages", "input")),
                "query": sorted(parse_qs(urlsplit(self.path).query)),
                # The name of the JSON schema the reply was asked to follow, and the last user text.
                "output_format": wire.output_format_name(body) if wire else output_format_name(body),
                "last_user": last_user_text(conversation),
                # Every user text in order (a run's session history comes before its own input).
                "users": [str(m.get("content") or "") for m in conversation if m.get("role") == "user"],
                # At most the last 4 characters, and only of keys long enough that they give nothing away.
                "key_last4": api_key[-4:] if api_key and len(api_key) >= 12 else None,
                "at": time.time(),
            }
        )
        owner.holding.wait(model)
        if decision.delay_s > 0:
            time.sleep(decision.delay_s)
        self._reply(api, model, body, decision, stream=stream)

    def _reply(
        self, api: str, model: str, body: dict[str, Any], decision: ScriptedReply | ScriptedError, *, stream: bool
    ) -> None:
        """Send what the script decided: its error, its reply streamed, or its reply whole."""
        owner = self.server.owner
        trickle = owner.config.for_model(model).trickle_s
        wire = WIRES.get(api)
        if isinstance(decision, ScriptedError):
            headers = {"Retry-After": f"{decision.retry_after:g}"} if decision.retry_after is not None else {}
            if decision.raw is not None:
                # Deliberately off-spec (a Fault's `body`): sent as it is, not built from openai's types.
                self.send(decision.status, decision.raw.encode(), decision.content_type, headers, trickle_s=trickle)
            else:
                error = wire.error(decision) if wire else error_reply(decision.body)
                self.send_json(decision.status, error, headers, trickle_s=trickle)
            return
        if stream:
            self._send_stream(api, model, decision, body)
            return
        fields = owner.config.for_model(model).usage_fields
        if wire is not None:
            self.send_json(200, wire.reply(model, decision, fields), trickle_s=trickle)
            return
        payload = chat_completion(model, decision) if api == "chat" else response_object(model, decision, body)
        if fields:
            payload["usage"] = {**payload["usage"], **fields}
        self.send_json(200, payload, trickle_s=trickle)

    def _send_stream(self, api: str, model: str, reply: ScriptedReply, body: dict[str, Any]) -> None:
        fields = self.server.owner.config.for_model(model).usage_fields
        if (wire := WIRES.get(api)) is not None:
            events = wire.events(model, reply, fields)
        elif api == "chat":
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = chat_chunks(model, reply, include_usage=include_usage, usage_fields=fields)
        else:
            events = response_events(model, reply, body, usage_fields=fields)
        if reply.break_after is not None and reply.break_error is not None and wire is None:
            events = [*events[: reply.break_after], error_event(api, reply.break_error, reply.break_after)]
        delay_s = self.server.owner.config.for_model(model).chunk_delay_s
        self.send_events(events, delay_s=delay_s, cut=reply.break_after if reply.break_error is None else None)

    def _path(self) -> str:
        path = self.path.split("?", 1)[0].rstrip("/")
        # Accept base URLs with or without /v1, as OpenAI-compatible servers do.
        return path[3:] if path.startswith("/v1/") else path

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def read_json(self) -> dict[str, Any] | None:
        try:
            body = json.loads(self._read_body() or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self._send_error(400, "the request body is not a JSON object")
            return None
        return body

    def _send_error(self, status: int, message: str) -> None:
        self.send_json(status, error_reply(error_body(status, message)))

    def send_json(
        self, status: int, payload: Any, headers: Mapping[str, str] | None = None, *, trickle_s: float = 0.0
    ) -> None:
        # json.dumps escapes what is not ASCII, so a NUL or a lone surrogate in a reply goes out
        # as \u0000 / \udcff, as a real provider's JSON would carry it.
        self.send(status, json.dumps(payload).encode(), "application/json", headers, trickle_s=trickle_s)

    def send(
        self,
        status: int,
        data: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
        *,
        trickle_s: float = 0.0,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if trickle_s <= 0:
            self.wfile.write(data)
            return
        for i in range(len(data)):  # unbuffered: each byte goes out on its own
            # A client that gave up closes the connection; the next write fails and ends this thread.
            self.wfile.write(data[i : i + 1])
            time.sleep(trickle_s)

    def send_events(self, events: list[bytes], *, delay_s: float, cut: int | None) -> None:
        """Server-sent events, one HTTP chunk each (unbuffered: each goes out as it is written),
        `delay_s` apart; with `cut`, the connection closes after that many, the body unfinished."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        for number, event in enumerate(events):
            if number == cut:
                self.close_connection = True
                return
            if number and delay_s > 0:
                time.sleep(delay_s)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.wfile.write(b"0\r\n\r\n")


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def main(argv: list[str] | None = None) -> None:
    """Run the server in the foreground (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m orchestrator.testing.server", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on start)")
    parser.add_argument("--config", default=None, help="the ScriptConfig as JSON, or @path to a JSON file")
    args = parser.parse_args(argv)
    config = ScriptConfig()
    if args.config:
        text = Path(args.config[1:]).read_text() if args.config.startswith("@") else args.config
        try:
            config = ScriptConfig.model_validate_json(text)
        except ValidationError as exc:
            parser.exit(2, f"invalid --config: {exc}\n")
    ScriptedServer(config, host=args.host, port=args.port).serve_forever()


if __name__ == "__main__":
    main()
