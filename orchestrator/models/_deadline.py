"""One deadline for a whole HTTP call of the openai client, not one timeout per socket read.

httpx's timeout bounds each phase and each read on its own, so a reply that trickles in a byte at
a time, each byte sooner than the timeout, never times out: on the threads pool nothing else stops
it, and the step holds its worker and its lease until the sweeper calls it a poison step.

`deadline_client(timeout)` is the httpx client the adapters give their SDK (openai's default
client, or the one `base` names: anthropic's for `Claude`). Its hooks give
each request a deadline, now + its timeout (the largest of its phase timeouts, which are all the
one number Ratchet passes). Once the headers are in, the body's reads may wait only for what is
left, and after each chunk of the body the call ends in `httpx.ReadTimeout` if the deadline has
passed and more body is due (a body already whole is kept). That goes through the SDK's own
timeout path (`APITimeoutError`, retryable), and the cut connection is closed, not reused.

So a reply arrives whole within about the timeout, or the call fails then. Connecting, sending
and the wait for the headers keep httpx's own per-phase bounds (the timeout each); headers that
trickle in byte by byte are bounded per read only: a reply's headers are a few hundred bytes, its
body is what a slow provider trickles. Hooks, not a transport: a client given its own transport
no longer honours HTTPS_PROXY and the like from the environment. Cost: a few µs a call (two
hook calls and one more generator over the body's chunks; httpcore's `trace` extension could
narrow every phase, but costs some 10 µs more per phase).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx2

DEADLINE = "ratchet.deadline"
# A timeout of 0 makes a socket non-blocking (an OSError, not a timeout): never narrow below this.
_FLOOR = 0.001
_closing_classes: dict[type[httpx2.Client], type[httpx2.Client]] = {}


def deadline_client(timeout: float, base: type[httpx2.Client] | None = None) -> httpx2.Client:
    """The SDK's default httpx client (`base`, else openai's `DefaultHttpxClient`) with a
    whole-call deadline on every request."""
    if base is None:
        import openai

        base = openai.DefaultHttpxClient
    return _closing(base)(timeout=timeout, event_hooks=deadline_hooks())


def deadline_hooks() -> dict[str, list[Callable[..., Any]]]:
    """The event hooks that give an httpx2 client's every request its whole-call deadline (for
    an SDK that builds its own client: the Gemini adapter's)."""
    return {"request": [_start], "response": [_watch_body]}


def _closing(base: type[httpx2.Client]) -> type[httpx2.Client]:
    """`base` closing its pool when dropped, as the SDKs' own clients do (a client dropped from
    the cache must not leave its connections open): one subclass per base."""
    made = _closing_classes.get(base)
    if made is not None:
        return made

    def __del__(self: httpx2.Client) -> None:
        try:
            if not self.is_closed:
                self.close()
        except Exception:
            pass

    made = _closing_classes[base] = type(f"Deadline{base.__name__}", (base,), {"__del__": __del__})
    return made


def _start(request: httpx2.Request) -> None:
    phases: dict[str, float | None] | None = request.extensions.get("timeout")
    if phases:
        total = max((v for v in phases.values() if v is not None), default=None)
        if total is not None:
            request.extensions[DEADLINE] = time.monotonic() + total


def _watch_body(response: httpx2.Response) -> None:
    request = response.request
    deadline = request.extensions.get(DEADLINE)
    if deadline is None or not isinstance(response.stream, httpx2.SyncByteStream):
        return
    # The body is not read yet, and httpcore takes its read timeout from this same dict when it
    # starts reading: from here on a read may wait only for what is left.
    phases = request.extensions["timeout"]
    left = max(deadline - time.monotonic(), _FLOOR)
    phases["read"] = left if phases.get("read") is None else min(phases["read"], left)
    length = response.headers.get("content-length")
    expected = int(length) if length is not None and length.isdigit() else None
    response.stream = _DeadlineStream(response.stream, deadline, request, expected)


class _DeadlineStream(httpx2.SyncByteStream):
    """A response body that ends in `ReadTimeout` when its deadline passes before it is whole."""

    def __init__(
        self, inner: httpx2.SyncByteStream, deadline: float, request: httpx2.Request, expected: int | None
    ) -> None:
        self._inner = inner
        self._deadline = deadline
        self._request = request
        self._expected = expected

    def __iter__(self) -> Iterator[bytes]:
        received = 0
        for chunk in self._inner:
            received += len(chunk)
            yield chunk
            # A body that is already whole is kept even if its last byte came late.
            if time.monotonic() > self._deadline and (self._expected is None or received < self._expected):
                raise httpx2.ReadTimeout(
                    "the reply did not arrive in full within the call's timeout", request=self._request
                )

    def close(self) -> None:
        self._inner.close()
