"""What every request passes before FastAPI reads it: the bearer token, and the body's size.

Both are checked here, in front of the routes, so that a request without a valid token is
refused (401) before its body is read or validated, and an oversized body (413) before it is
parsed: by its Content-Length at once, or, sent in chunks, as soon as it grows past the limit.
The token is a static one (RATCHET_API_TOKENS: a service) or a JWT (`workers.api.access`: a
user); the caller it stands for is left in the request's scope for the routes to ask
(`access.caller_of`). A JWT refused says why (expired, signature, audience...), in the error body
and in `WWW-Authenticate`; a JWKS that cannot be fetched is a 503, the server's trouble.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

import anyio.to_thread
import jwt
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workers.api import ui
from workers.api.access import CALLER_KEY, SERVICE, Caller, TokenRefused, Verifier
from workers.api.deps import route_path
from workers.api.problems import error_response

#: Paths served without a token: the liveness probe, the API's own description, and the run
#: pages' files (they hold no data: their script sends the token on each request it makes).
PUBLIC_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}) | ui.PATHS


class BodyTooLarge(HTTPException):
    """A chunked body grew past the limit while a route read it (answered 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes (RATCHET_API_MAX_BODY_BYTES)")


class Gate:
    """ASGI middleware: who calls (a static token, a JWT, or anyone when neither is configured)
    and the body size limit."""

    def __init__(
        self, app: ASGIApp, *, tokens: Sequence[str], max_body_bytes: int, verifier: Verifier | None = None
    ) -> None:
        self.app = app
        # Digests, compared in constant time: equal lengths whatever was sent, so the time taken
        # does not tell a token's length either; the header is read as UTF-8, as the tokens are.
        self._tokens = [hashlib.sha256(t.encode()).digest() for t in tokens]
        self._verifier = verifier
        self._limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not self._tokens and self._verifier is None:
            scope = {**scope, CALLER_KEY: SERVICE}
        elif (route_path(scope) or "/") not in PUBLIC_PATHS:
            caller = await self._caller(headers)
            if not isinstance(caller, Caller):
                await caller(scope, receive, send)
                return
            scope = {**scope, CALLER_KEY: caller}
        size = headers.get("content-length", "")
        if size.isdigit() and int(size) > self._limit:
            too_large = error_response(413, "ContentTooLarge", BodyTooLarge(self._limit).detail)
            await too_large(scope, receive, send)
            return
        await self.app(scope, self._counting(receive), send)

    async def _caller(self, headers: Headers) -> Caller | Response:
        """The caller the request's token stands for, or the refusal to answer it with."""
        if self._authorized(headers):
            return SERVICE
        scheme, _, given = headers.get("authorization", "").partition(" ")
        token = given.strip()
        if self._verifier is not None and scheme.lower() == "bearer" and token.count(".") == 2:
            verifier = self._verifier
            try:
                if verifier.fetches:  # the JWKS may be fetched: a network call, off the event loop
                    return await anyio.to_thread.run_sync(verifier.caller, token)
                return verifier.caller(token)
            except TokenRefused as exc:
                return error_response(
                    401,
                    "InvalidToken",
                    f"the bearer token was refused: {exc}",
                    headers={"WWW-Authenticate": f'Bearer error="invalid_token", error_description="{_quoted(exc)}"'},
                )
            except jwt.PyJWKClientConnectionError:
                return error_response(
                    503,
                    "JwksUnavailable",
                    "the keys tokens are verified with cannot be fetched from RATCHET_JWT_JWKS_URL now: try again",
                    headers={"Retry-After": "5"},
                )
        what = "RATCHET_API_TOKENS, or a JWT" if self._verifier is not None else "RATCHET_API_TOKENS"
        return error_response(
            401,
            "Unauthorized",
            f"send a valid token: `Authorization: Bearer <token>` ({what})",
            headers={"WWW-Authenticate": "Bearer"},
        )

    def _authorized(self, headers: Headers) -> bool:
        """Whether the request carries one of the tokens. Every token is compared, each in
        constant time, so the time taken says nothing about which one, or how much, matched."""
        scheme, _, given = headers.get("authorization", "").partition(" ")
        offered = hashlib.sha256(
            given.strip().encode("latin-1", "replace").decode("utf-8", "replace").encode()
        ).digest()
        matched = False
        for token in self._tokens:
            matched |= hmac.compare_digest(offered, token)
        return matched and scheme.lower() == "bearer"

    def _counting(self, receive: Receive) -> Receive:
        """`receive`, refusing a body that grows past the limit without having said its size."""
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self._limit:
                    raise BodyTooLarge(self._limit)
            return message

        return counted


def _quoted(exc: Exception) -> str:
    """A reason as a quoted-string of a header may hold it: printable ASCII, no quote or backslash."""
    return "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "'" for c in str(exc))[:200]
