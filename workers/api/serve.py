"""`ratchet api`: serving the HTTP API on uvicorn, and where it may listen.

Without RATCHET_API_TOKENS the API takes requests without a token, so it listens on a loopback
address only (127.0.0.1 by default) and says so at start; asking for another host is refused with
what to set; and it refuses what a web page of another site could send it (`workers.api.loopback`).
With tokens it listens where it is told, and every request but /health and the API's own
description needs one. The tokens are never logged: the start line says how many there are.

This module imports neither FastAPI nor uvicorn until it serves, so the command line works
without the `api` extra and says what to install when `ratchet api` needs it.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
from typing import Any

from orchestrator.client import Client
from orchestrator.errors import ConfigurationError
from orchestrator.settings import Settings

log = logging.getLogger("ratchet.api")
#: Seconds a stopping server lets open requests finish before it cuts them: an event stream or a
#: long wait would otherwise hold it up for as long as its run goes on. Their clients ask again
#: (an event stream with Last-Event-ID), of another server or of this one restarted.
GRACEFUL_SHUTDOWN = 5


def add_api_command(sub: Any) -> None:
    """Add `ratchet api` to the command line's subcommands."""
    p = sub.add_parser("api", help="serve the HTTP API (needs the api extra: FastAPI and uvicorn)")
    p.add_argument("--app", action="append", default=[], metavar="MODULE", help="module defining your agents")
    p.add_argument("--host", default="127.0.0.1", help="without RATCHET_API_TOKENS, a loopback address only")
    p.add_argument("--port", type=int, default=8000)
    p.set_defaults(func=cmd_api)


def cmd_api(args: argparse.Namespace) -> int:
    """Import the agents (a start naming none of them is a 404), then serve until interrupted."""
    from workers.celery.app import import_apps

    if not import_apps(args.app):
        raise ConfigurationError(
            "ratchet api needs --app MODULE (or RATCHET_APP): the module that defines your agents, so that a "
            "request naming no agent of yours is refused"
        )
    serve(Settings.from_env(), host=args.host, port=args.port)
    return 0


def serve(settings: Settings, *, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve the API on `host`:`port` until interrupted (uvicorn's SIGINT/SIGTERM handling)."""
    check_host(settings, host)
    try:
        import uvicorn

        from workers.api.routes import create_app
    except ImportError as exc:
        raise ConfigurationError(
            f"ratchet api needs the api extra (pip install 'ratchet-agents[api]'): {exc}"
        ) from None
    log.setLevel(logging.INFO)  # the start line below, and requests that fail on the server
    tokens = settings.api_token_values
    if tokens:
        log.info("bearer-token auth is on: %d token(s) from RATCHET_API_TOKENS", len(tokens))
    else:
        log.warning(
            "RATCHET_API_TOKENS is not set: the API takes requests without a token, so it listens on %s only", host
        )
    app = create_app(settings, client=Client(settings))
    uvicorn.run(
        app, host=host, port=port, log_level="info", server_header=False, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN
    )


def check_host(settings: Settings, host: str) -> None:
    """Refuse to listen beyond this machine without tokens: anyone who could reach the port could
    start, read and cancel runs."""
    if settings.api_token_values:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name, which could resolve anywhere
        loopback = False
    if not loopback:
        raise ConfigurationError(
            f"refusing to serve the API on {host!r} without authentication: set RATCHET_API_TOKENS (comma-separated "
            "bearer tokens) to listen beyond this machine, or listen on 127.0.0.1"
        )
