"""`ratchet api`: serving the HTTP API on uvicorn, and where it may listen.

Without RATCHET_API_TOKENS the API takes requests without a token, so it listens on a loopback
address only (127.0.0.1 by default) and says so at start; asking for another host is refused with
what to set; and it refuses what a web page of another site could send it (`workers.api.loopback`).
With tokens, or a JWT key or JWKS URL (`workers.api.access`), it listens where it is told, and
every request but /health and the API's own description needs one. The tokens are never logged:
the start line says how many there are, and which algorithms JWTs are verified with.

`--workers N` serves it from N uvicorn worker processes sharing the port; each imports the
agents and builds the app anew (`served_app`). `--root-path /prefix` is
for a proxy that serves the API under `/prefix` and strips it before forwarding: the schema,
the docs, the run pages' redirects and `Location` then carry the prefix.

This module imports neither FastAPI nor uvicorn until it serves, so the command line works
without the `api` extra and says what to install when `ratchet api` needs it.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import re
from typing import TYPE_CHECKING, Any

from orchestrator.client import Client
from orchestrator.errors import ConfigurationError
from orchestrator.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI

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
    p.add_argument("--workers", type=workers_option, default=1, metavar="N", help="serve from N processes (default 1)")
    p.add_argument(
        "--root-path", type=root_path_option, default="", metavar="PATH", help="the path a proxy serves the API under"
    )
    p.set_defaults(func=cmd_api)


def workers_option(text: str) -> int:
    """`--workers`: a whole number of processes, at least one."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"give a number of processes, 1 or more, not {text!r}")
    return int(text)


def root_path_option(text: str) -> str:
    """`--root-path`: a URL path, `/` first (a trailing `/` is dropped), or '' for none."""
    path = text.strip().rstrip("/")
    if path and re.fullmatch(r"(/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)+", path) is None:
        raise argparse.ArgumentTypeError(
            f"give the path the proxy serves the API under, such as /ratchet, not {text!r}"
        )
    return path


def cmd_api(args: argparse.Namespace) -> int:
    """Import the agents (a start naming none of them is a 404), then serve until interrupted."""
    from workers.celery.app import import_apps

    modules = import_apps(args.app)
    if not modules:
        raise ConfigurationError(
            "ratchet api needs --app MODULE (or RATCHET_APP): the module that defines your agents, so that a "
            "request naming no agent of yours is refused"
        )
    # Each worker process of --workers builds its app from the environment (`served_app`).
    os.environ["RATCHET_APP"] = ",".join(modules)
    serve(Settings.from_env(), host=args.host, port=args.port, workers=args.workers, root_path=args.root_path)
    return 0


def serve(
    settings: Settings, *, host: str = "127.0.0.1", port: int = 8000, workers: int = 1, root_path: str = ""
) -> None:
    """Serve the API on `host`:`port` until interrupted (uvicorn's SIGINT/SIGTERM handling), from
    `workers` processes (more than one: each builds its app from the environment, `served_app`),
    under `root_path` when a proxy serves it there."""
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
    if settings.api_auth and settings.jwt_algorithm_values:
        source = "RATCHET_JWT_JWKS_URL" if settings.jwt_jwks_url else "RATCHET_JWT_KEY"
        log.info("JWTs are taken: %s, verified with %s", ",".join(settings.jwt_algorithm_values), source)
    if not settings.api_auth:
        log.warning(
            "RATCHET_API_TOKENS is not set: the API takes requests without a token, so it listens on %s only", host
        )
    # One process serves the app built here, with these settings; several import it by name.
    app = create_app(settings, client=Client(settings)) if workers == 1 else f"{__name__}:served_app"
    uvicorn.run(
        app,
        factory=workers > 1,
        workers=workers,
        root_path=root_path,
        host=host,
        port=port,
        log_level="info",
        server_header=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN,
    )


def served_app() -> FastAPI:
    """The app of one `ratchet api --workers N` process: the agents RATCHET_APP names imported,
    and a Client of the environment's settings (uvicorn calls it in each worker process)."""
    from workers.api.routes import create_app
    from workers.celery.app import import_apps

    import_apps([])
    settings = Settings.from_env()
    return create_app(settings, client=Client(settings))


def check_host(settings: Settings, host: str) -> None:
    """Refuse to listen beyond this machine without tokens: anyone who could reach the port could
    start, read and cancel runs."""
    if settings.api_auth:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name, which could resolve anywhere
        loopback = False
    if not loopback:
        raise ConfigurationError(
            f"refusing to serve the API on {host!r} without authentication: set RATCHET_API_TOKENS (comma-separated "
            "bearer tokens) or RATCHET_JWT_KEY / RATCHET_JWT_JWKS_URL to listen beyond this machine, or listen on "
            "127.0.0.1"
        )
