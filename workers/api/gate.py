"""What every request passes before FastAPI reads it: the bearer token, and the body's size.

Both are checked here, in front of the routes, so that a request without a valid token is
refused (401) before its body is read or validated, and an oversized body (413) before it is
parsed: by its Content-Length at once, or, sent in chunks, as soon as it grows past the limit.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workers.api import ui
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
    """ASGI middleware: bearer-token auth (when tokens are configured) and the body size limit."""

    def __init__(self, app: ASGIApp, *, tokens: Sequence[str], max_body_bytes: int) -> None:
        self.app = app
        # Digests, compared in constant time: equal lengths whatever was sent, so the time taken
        # does not tell a token's length either; the header is read as UTF-8, as the tokens are.
        self._tokens = [hashlib.sha256(t.encode()).digest() for t in tokens]
        self._limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if self._tokens and (route_path(scope) or "/") not in PUBLIC_PATHS and not self._authorized(headers):
            refusal = error_response(
                401,
                "Unauthorized",
                "send a valid token: `Authorization: Bearer <token>` (RATCHET_API_TOKENS)",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await refusal(scope, receive, send)
            return
        size = headers.get("content-length", "")
        if size.isdigit() and int(size) > self._limit:
            too_large = error_response(413, "ContentTooLarge", BodyTooLarge(self._limit).detail)
            await too_large(scope, receive, send)
            return
        await self.app(scope, self._counting(receive), send)

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
