"""What the API refuses without tokens: the requests a web page of another site could make.

Without RATCHET_API_TOKENS the API listens on a loopback address only (`workers.api.serve`) and
takes any request that reaches it; a browser on this machine reaches it too, for any page it
shows. So, in front of every route (`Guard`):

- Host, else 421: the request names this machine, as `localhost` (or a name under it) or a
  loopback address (127.0.0.0/8, [::1]), with any port. A page that points its own domain at
  127.0.0.1 (DNS rebinding) sends that domain as Host, and so reads nothing.
- Origin, else 403: a browser names the page behind a fetch, and a page of another origin is
  refused, reading or writing, unless RATCHET_API_CORS_ORIGINS lists it. A request of another
  site that names no Origin (an `<img>` or `<script>` of its page) says so in `Sec-Fetch-Site`
  and is refused too, but for a navigation: a person following a link to a run page.
- Content-Type, else 415: any method but GET, HEAD and OPTIONS says `application/json`, with a
  body or without. A form on another site, or its plain fetch, cannot send that without a CORS
  preflight, which the API grants to no origin but those listed.

A websocket is checked for its Host and Origin likewise (closed with 1008 if refused), so a route
added later is not open to another site's page.

The run pages fetch from their own origin and send JSON; curl and the other clients that are
not browsers send no Origin. With tokens or JWTs none of this applies (a page cannot send a token
it does not hold), and CORS is off unless RATCHET_API_CORS_ORIGINS lists origins (`add_cors`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from workers.api.contract import error_content
from workers.api.problems import error_response

#: The methods that change nothing: every other one must say it sends JSON.
SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
#: What `Sec-Fetch-Site` says of a request another site's page made.
FOREIGN_SITES = frozenset({"cross-site", "same-site"})
#: What a page of a listed origin may send (CORS): the methods and headers the API takes.
CORS_HEADERS = ["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID"]


class Guard:
    """ASGI middleware of the tokenless API: the Host, Origin and Content-Type checks above."""

    def __init__(self, app: ASGIApp, *, origins: Sequence[str] = ()) -> None:
        self.app = app
        self._origins = frozenset(o.lower() for o in origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # the lifespan
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        origin = headers.get("origin")
        method = scope.get("method", "GET")  # a websocket opens with a GET
        foreign = origin is None and headers.get("sec-fetch-site") in FOREIGN_SITES
        if scope["type"] == "websocket":
            scheme = "https" if scope.get("scheme") == "wss" else "http"  # the page's scheme
            if loopback_host(host) and not foreign and (origin is None or self._allowed(origin, scheme, host)):
                await self.app(scope, receive, send)
            else:
                await send({"type": "websocket.close", "code": 1008})
            return
        if not loopback_host(host):
            refusal = error_response(
                421,
                "MisdirectedRequest",
                f"this API serves this machine only, as localhost or a loopback address, not as Host {host[:100]!r} "
                "(without RATCHET_API_TOKENS it takes requests without a token): reach it at http://127.0.0.1:PORT, "
                "or set RATCHET_API_TOKENS to serve it under another name",
            )
        elif (origin is not None and not self._allowed(origin, scope["scheme"], host)) or (
            foreign and headers.get("sec-fetch-mode") != "navigate"
        ):
            origin = origin or f"another site ({headers.get('sec-fetch-site')})"
            refusal = error_response(
                403,
                "ForeignOrigin",
                f"a page of {origin[:100]!r} may not call this API: without RATCHET_API_TOKENS only its own pages may; "
                "list that origin in RATCHET_API_CORS_ORIGINS to let its pages in",
            )
        elif method not in SAFE and media_type(headers) != "application/json":
            refusal = error_response(
                415,
                "UnsupportedMediaType",
                f"a {method} must send `Content-Type: application/json` (with a body or without): without "
                "RATCHET_API_TOKENS, that is what tells a client's request from a form another site's page sent",
            )
        else:
            await self.app(scope, receive, send)
            return
        await refusal(scope, receive, send)

    def _allowed(self, origin: str, scheme: str, host: str) -> bool:
        """The request's own origin (the page the API served), or one listed."""
        return origin.lower() in self._origins or same_origin(origin, scheme, host)


#: What the Guard answers, by status, as the schema says it of every operation it stands in front of.
REFUSED = {421: "Host names no loopback address", 403: "a page of another origin", 415: "a write that is not JSON"}


def declare_refusals(app: FastAPI) -> None:
    """The app's schema with what the Guard refuses stated on each operation: 421 and 403 on
    every one, 415 on those whose method is not SAFE. For an API served without tokens."""
    stated = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = stated()
            for operations in schema.get("paths", {}).values():
                for method, operation in operations.items():
                    for status, description in REFUSED.items():
                        if status != 415 or method.upper() not in SAFE:
                            operation["responses"].setdefault(
                                str(status), {"description": description, **error_content()}
                            )
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def add_cors(app: Starlette, origins: Sequence[str]) -> None:
    """CORS for the pages of these origins only: the API's methods and headers, no cookies (a
    token travels in `Authorization`), and the headers a client reads back."""
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(origins),
        allow_methods=["GET", "POST", "DELETE"],
        allow_headers=CORS_HEADERS,
        expose_headers=["Location", "Retry-After", "WWW-Authenticate"],
    )


def media_type(headers: Headers) -> str:
    """The request's Content-Type without its parameters, in lower case ('' if it has none)."""
    return headers.get("content-type", "").partition(";")[0].strip().lower()


def loopback_host(host: str) -> bool:
    """Whether a Host header names this machine: `localhost`, a name under `.localhost`, or a
    loopback address (an IPv6 one in brackets), with or without a port."""
    name, port = _split(host.strip().lower())
    if name is None or (port and not port.isdigit()):
        return False
    name = name.removesuffix(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def same_origin(origin: str, scheme: str, host: str) -> bool:
    """Whether `origin` (`scheme://host[:port]`) is the one the request came to."""
    try:
        parts = urlsplit(origin.strip().lower())
        given = (parts.scheme, parts.hostname, parts.port or _DEFAULT_PORTS.get(parts.scheme))
    except ValueError:
        return False
    name, port = _split(host.strip().lower())
    if name is None or parts.path or (port and not port.isdigit()):
        return False
    own = (scheme, name, int(port) if port else _DEFAULT_PORTS.get(scheme))
    return given == own


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _split(host: str) -> tuple[str | None, str]:
    """A Host header as (name, port): `[::1]:8000` -> ("::1", "8000"); (None, "") if malformed."""
    if host.startswith("["):
        name, bracket, rest = host[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None, ""
        return name, rest[1:]
    if host.count(":") == 1:
        name, _, port = host.partition(":")
        return name, port
    return (host, "") if host else (None, "")
