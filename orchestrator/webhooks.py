"""Webhooks: a run started with `webhook=` has each of its stops POSTed to that URL.

Each move of the run to COMPLETED, ERROR, CANCELLED or PAUSED writes a row in the webhook outbox
(`store/webhook_rows.py`) in the transaction of the move, and the sweeper's delivery pass
(`deliver_due`) POSTs it, so a delivery is owed exactly when the stop committed and survives any
crash: at least once, under a `Ratchet-Delivery` id the receiver de-duplicates on. The body:

    {"delivery_id": "...", "event": "run.stopped",
     "run": {"run_id", "session_id", "agent_name", "status", "seq", "content", "error"}}

Signed as Stripe signs: `Ratchet-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`
keyed with RATCHET_WEBHOOK_SECRET (`signature`, `verify`). A 2xx ends the delivery; 410 Gone
ends it failed; anything else (another status, a refused connection, a timeout) is tried again
after an exponential backoff with jitter, until RATCHET_WEBHOOK_MAX_ATTEMPTS, then it is failed.
Redirects are not followed.

Where it may go (`check_url`): http or https, and every address its host resolves to public
(`ipaddress`'s `is_global`), unless the host or a network holding the address is listed in
RATCHET_WEBHOOK_ALLOW. So loopback, private, link-local (169.254.0.0/16, fe80::/10: cloud
metadata) and the metadata host names are refused by default. It is checked at start (a clear
InvalidInputError) and again at each delivery, which connects to the address it checked (a DNS
answer that changed since cannot point it elsewhere).
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import ipaddress
import json
import logging
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel

from orchestrator.errors import InvalidInputError, UnresolvedHostError
from orchestrator.settings import Settings
from orchestrator.store import Store, webhook_rows
from orchestrator.untrusted import clip

log = logging.getLogger("ratchet.webhooks")

#: The longest URL a start may give.
URL_MAX = 2048
#: Host names that answer with a cloud's instance metadata: refused unless listed.
METADATA_HOSTS = frozenset({"metadata", "metadata.google.internal", "metadata.goog", "instance-data"})
#: The longest wait between two attempts.
BACKOFF_MAX = 3600.0
#: Deliveries one pass sends at most.
BATCH = 50

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def signature(secret: str, body: bytes, timestamp: int) -> str:
    """The `Ratchet-Signature` header of `body` sent at `timestamp`."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: str, body: bytes, header: str, *, tolerance: float = 300.0, now: float | None = None) -> bool:
    """What a receiver does: whether `header` signs `body` with `secret`, sent within `tolerance`
    seconds of `now` (a replayed old delivery is refused)."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        return False
    expected = signature(secret, body, timestamp).split("v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))


def check_url(url: object, settings: Settings) -> str:
    """The webhook a start gives, checked (InvalidInputError saying what to change)."""
    if not isinstance(url, str) or not url or len(url) > URL_MAX:
        raise InvalidInputError(f"webhook must be an http(s) URL of 1 to {URL_MAX} characters")
    if settings.webhook_secret is None:
        raise InvalidInputError(
            "webhook needs RATCHET_WEBHOOK_SECRET (or RATCHET_WEBHOOK_SECRET_FILE) set where runs start and where "
            "workers run: deliveries are signed with it"
        )
    resolve_checked(url, settings)
    return url


def resolve_checked(url: str, settings: Settings) -> tuple[str, int, IPAddress]:
    """The host, port and first address `url` goes to, every address the host resolves to
    checked against RATCHET_WEBHOOK_ALLOW (InvalidInputError naming the one refused)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInputError(f"webhook {url!r} must be an http:// or https:// URL with a host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise InvalidInputError(f"webhook {url!r} has a port that is not a number from 0 to 65535") from None
    host = parts.hostname.lower().rstrip(".")
    allowed = settings.webhook_allow_values
    if host in METADATA_HOSTS and not _names(host, allowed):
        raise InvalidInputError(
            f"webhook host {host!r} is a cloud metadata service: refused unless RATCHET_WEBHOOK_ALLOW lists it"
        )
    addresses = _addresses(host, port)
    for address in addresses:
        if not _allowed(host, address, allowed):
            # The address stays in the server's log: a caller is not told what an internal name resolves to.
            log.warning("webhook host %r refused: it resolves to %s", host, address)
            raise InvalidInputError(
                f"webhook host {host!r} is not a public address (loopback, private, link-local or reserved): "
                "add the host or a network holding it to RATCHET_WEBHOOK_ALLOW to allow it"
            )
    return host, port, addresses[0]


def _addresses(host: str, port: int) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise UnresolvedHostError(f"webhook host {host!r} does not resolve ({exc}): check the URL") from None
    found = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
    return list(dict.fromkeys(found))


def _names(host: str, allowed: Sequence[str]) -> bool:
    return any(entry.lower().rstrip(".") == host for entry in allowed)


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one wraps (mapped, 6to4, Teredo's client, NAT64's 64:ff9b::/96,
    IPv4-compatible ::/96), so that the check sees where the packets really go."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    packed = int(address)
    if address in _NAT64 or (packed >> 32 == 0 and packed > 1):  # not :: or ::1, which are checked as IPv6
        return ipaddress.IPv4Address(packed & 0xFFFFFFFF)
    return None


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _allowed(host: str, address: IPAddress, allowed: Sequence[str]) -> bool:
    if _names(host, allowed) or _in_networks(address, allowed):
        return True
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded_ipv4(address)
        if inner is not None:  # judged by the IPv4 address it wraps
            return _in_networks(inner, allowed) or (inner.is_global and not inner.is_multicast)
    return address.is_global and not address.is_multicast


def _in_networks(address: IPAddress, allowed: Sequence[str]) -> bool:
    for entry in allowed:
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue  # a host name (settings refuse a malformed network)
    return False


class WebhookDelivery(BaseModel):
    """One stop of a run told to its webhook, as `Client.webhook_deliveries` and the API show it."""

    delivery_id: str
    url: str
    #: The status the run stopped at.
    run_status: str
    #: "pending" (to be tried at `next_attempt_at`), "delivered" or "failed" (see `last_error`).
    state: str
    attempts: int
    created_at: float
    next_attempt_at: float | None = None
    last_error: str | None = None
    delivered_at: float | None = None


def deliveries(store: Store, run_id: str) -> list[WebhookDelivery]:
    """The run's deliveries, oldest first; RunNotFoundError if there is no such run."""
    fields = WebhookDelivery.model_fields
    return [WebhookDelivery(**{k: v for k, v in row.items() if k in fields}) for row in store.webhooks.of_run(run_id)]


@dataclass(frozen=True)
class Outcome:
    """One attempt's answer: the HTTP status, or None and why the request failed."""

    status: int | None
    error: str | None = None


#: Sends one delivery: (url, body, headers, settings) -> Outcome. `post` by default.
Sender = Callable[[str, bytes, dict[str, str], Settings], Outcome]


def body_of(row: Any) -> bytes:
    """The JSON a delivery POSTs."""
    error = None if row.error_type is None else {"type": row.error_type, "message": row.error_message or ""}
    run = {
        "run_id": row.run_id,
        "session_id": row.session_id,
        "agent_name": row.agent_name,
        "status": row.run_status,
        "seq": row.seq,
        "content": row.content,
        "error": error,
    }
    return json.dumps({"delivery_id": row.delivery_id, "event": "run.stopped", "run": run}).encode()


def deliver_due(store: Store, settings: Settings, *, send: Sender | None = None, now: float | None = None) -> int:
    """Send the deliveries due (at most `BATCH`), one at a time, and record each outcome; how
    many were tried. The sweeper calls it each pass, under the fleet's sweep lease: it starts no
    delivery once a sweep interval (RATCHET_SWEEP_SECONDS) has passed, so that a slow receiver
    cannot hold the pass past the lease; the rest wait for the next pass."""
    send = send or post
    at = store.clock() if now is None else now
    stop_at = time.monotonic() + settings.sweep_seconds
    rows = store.webhooks.due(at, BATCH)
    secret = settings.webhook_secret.get_secret_value() if settings.webhook_secret is not None else ""
    tried = 0
    for row in rows:
        if time.monotonic() > stop_at:
            break
        tried += 1
        body = body_of(row)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "ratchet-webhooks",
            "Ratchet-Delivery": row.delivery_id,
            "Ratchet-Signature": signature(secret, body, int(time.time())),
        }
        unsigned = Outcome(None, "RATCHET_WEBHOOK_SECRET is not set where the sweeper runs")
        outcome = send(row.url, body, headers, settings) if secret else unsigned
        _settle(store, settings, row, outcome)
    return tried


def _settle(store: Store, settings: Settings, row: Any, outcome: Outcome) -> None:
    attempts, now = row.attempts + 1, store.clock()
    state, retry_at, error = webhook_rows.PENDING, None, outcome.error
    if outcome.status is not None and 200 <= outcome.status < 300:
        state, error = webhook_rows.DELIVERED, None
    elif outcome.status == 410:
        state, error = webhook_rows.FAILED, "the receiver answered 410 Gone: not sent again"
    else:
        error = error or f"the receiver answered HTTP {outcome.status}"
        if attempts >= settings.webhook_max_attempts or error.startswith("refused:"):
            state = webhook_rows.FAILED
        else:
            retry_at = now + backoff(settings.webhook_backoff_seconds, attempts)
    if state != webhook_rows.DELIVERED:
        log.warning("webhook %s of run %s: attempt %d: %s (%s)", row.delivery_id, row.run_id, attempts, error, state)
    store.webhooks.settle(
        row.delivery_id,
        attempts=attempts,
        state=state,
        now=now,
        next_attempt_at=retry_at,
        error=None if error is None else clip(error, 1000),
    )


def backoff(base: float, attempts: int) -> float:
    """The wait after the `attempts`-th failure: `base` doubled each time, capped at an hour,
    between half and all of it (jitter, so that a receiver back up is not hit at once by all)."""
    delay = min(BACKOFF_MAX, base * 2.0 ** (attempts - 1))
    return float(delay * (0.5 + random.random() / 2))


def post(url: str, body: bytes, headers: dict[str, str], settings: Settings) -> Outcome:
    """POST `body` to `url` at the address its host resolves to now, checked again (a refused
    one fails the delivery for good, its error starting "refused:"; a host that does not resolve
    is tried again later)."""
    try:
        host, port, address = resolve_checked(url, settings)
    except UnresolvedHostError as exc:  # perhaps a passing DNS failure: tried again with the backoff
        return Outcome(None, str(exc))
    except InvalidInputError as exc:
        return Outcome(None, f"refused: {exc}")
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    timeout = settings.webhook_timeout_seconds
    conn: http.client.HTTPConnection = (
        _PinnedHTTPS(host, port, str(address), timeout)
        if parts.scheme == "https"
        else _PinnedHTTP(host, port, str(address), timeout)
    )
    # The socket's timeout bounds each read, not the request: a receiver dripping a byte a
    # little faster would hold the sweeper for hours. The watchdog cuts the connection once
    # RATCHET_WEBHOOK_TIMEOUT_SECONDS have passed in all.
    watchdog = _Watchdog(conn, timeout)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response.read(65536)
        if watchdog.cut:
            raise TimeoutError("the connection was cut")
        return Outcome(response.status)
    except Exception as exc:  # a refused connection, a timeout, a reply that is not HTTP: try again later
        if watchdog.cut:
            return Outcome(None, f"TimeoutError: the receiver took longer than {timeout:g} s in all")
        return Outcome(None, f"{type(exc).__name__}: {exc}")
    finally:
        watchdog.cancel()
        conn.close()


class _Watchdog:
    """Shuts the connection's socket down `seconds` from now (its blocked read then ends),
    unless cancelled first; `cut` says whether it did."""

    def __init__(self, link: http.client.HTTPConnection, seconds: float) -> None:
        self.link, self.cut = link, False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.cut = True
        sock = self.link.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    def cancel(self) -> None:
        self._timer.cancel()


class _PinnedHTTP(http.client.HTTPConnection):
    """An HTTP connection to `address`, the host's address that was checked, whatever DNS says now."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """The same over TLS: the certificate is checked against the URL's host name."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        self.tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self.tls)
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self.tls.wrap_socket(sock, server_hostname=self.host)
