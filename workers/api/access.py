"""Who calls the API, what each route lets them do, and whose runs they reach.

A request's caller is found by the Gate (`workers.api.gate`) before the route runs:

- a static token (RATCHET_API_TOKENS) is a service: every scope, every user's runs (`SERVICE`);
- a JSON Web Token, verified with PyJWT against RATCHET_JWT_KEY or the keys of
  RATCHET_JWT_JWKS_URL (`Verifier`), is a user: its `sub` is the user_id it acts for, its `scope`
  (space-separated) or `scp` claim the scopes it has;
- without tokens or JWTs configured (the loopback API), every request is a service.

Each route needs one scope (`ROUTE_SCOPES`, by operation id): `read` to list and read runs,
sessions, approvals, the agent catalog, schedules and the event stream; `write` to start,
continue and cancel runs, delete sessions, and create and delete schedules; `decide` to decide a
requirement (and a continue that carries decisions); `admin` for the operators' routes (metrics,
the health checks). `admin` holds every scope and every user's runs, as a static token does. A
route of a router from `deps.token_router` that has no entry here is refused to every caller: a
new route is closed until it is given one.

A user's caller reaches only its own runs (a run's `user_id`; a team's member runs carry their
team's) and sessions (a session is its first run's user's): another's is answered as an unknown
one (404), so a run id does not tell whether it exists. Naming another user in a listing's
`user_id` is a 403, since the caller knows whom it asked for; a start names no user or its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import jwt
from fastapi import Depends, FastAPI, Request
from starlette.types import Scope

from orchestrator import validation
from orchestrator.client import Client
from orchestrator.errors import ConfigurationError, InvalidInputError, RunNotFoundError
from orchestrator.settings import Settings
from workers.api.contract import error_content
from workers.api.problems import ApiError

READ, WRITE, DECIDE, ADMIN = "read", "write", "decide", "admin"
SCOPES = frozenset({READ, WRITE, DECIDE, ADMIN})

#: The scope each route needs, by its operation id. `tests/integration/test_api_access.py` walks
#: the app's routes: one missing here fails it, as it is refused to every caller when served.
ROUTE_SCOPES = {
    "startRun": WRITE,
    "getRun": READ,
    "listRunWebhooks": READ,
    "waitForRun": READ,
    "continueRun": WRITE,
    "cancelRun": WRITE,
    "continueRuns": WRITE,
    "cancelRuns": WRITE,
    "streamRunEvents": READ,
    "listRuns": READ,
    "getRunLog": READ,
    "getRunSteps": READ,
    "getSession": READ,
    "getSessionRuns": READ,
    "deleteSession": WRITE,
    "listAgents": READ,
    "getAgent": READ,
    "decideRequirement": DECIDE,
    "listApprovals": READ,
    "createSchedule": WRITE,
    "listSchedules": READ,
    "deleteSchedule": WRITE,
    "getMetrics": ADMIN,
    "checkHealth": ADMIN,
}
#: Where the Gate leaves the caller in a request's ASGI scope (kept through a mount).
CALLER_KEY = "ratchet.caller"
#: How long a JWT's times may be off the server's clock, in seconds.
LEEWAY = 30


@dataclass(frozen=True)
class Caller:
    """Who a request is from: a user (a JWT's `sub`), or None for a service, and its scopes."""

    user_id: str | None
    scopes: frozenset[str]

    @property
    def admin(self) -> bool:
        """Every scope and every user's runs: a static token, or a JWT with the admin scope."""
        return ADMIN in self.scopes

    def may(self, scope: str) -> bool:
        return self.admin or scope in self.scopes

    def sees(self, user_id: str | None) -> bool:
        """Whether the caller reaches what belongs to `user_id` (a run's, a session's)."""
        return self.admin or (self.user_id is not None and user_id == self.user_id)


SERVICE = Caller(user_id=None, scopes=SCOPES)


class TokenRefused(Exception):
    """A JWT that does not verify, or grants nothing: answered 401, saying why."""


class Verifier:
    """Verifies a JWT with PyJWT against the configured key or JWKS: its signature with one of
    the configured algorithms, `exp` (required) and `nbf` with LEEWAY, `aud` and `iss` when set,
    and a `sub` to act for."""

    def __init__(self, settings: Settings) -> None:
        self.algorithms = list(settings.jwt_algorithm_values)
        self.audience = settings.jwt_audience
        self.issuer = settings.jwt_issuer
        self.jwks = None if not settings.jwt_jwks_url else jwt.PyJWKClient(settings.jwt_jwks_url, timeout=10)
        self._key: Any = None
        if settings.jwt_key is not None:
            secret = settings.jwt_key.get_secret_value()
            algorithm = jwt.get_algorithm_by_name(self.algorithms[0])
            try:  # loaded once, at start: a key that cannot be read stops the server, not a request
                self._key = algorithm.prepare_key(secret)
            except (ValueError, TypeError, jwt.InvalidKeyError) as exc:
                raise ConfigurationError(
                    f"RATCHET_JWT_KEY cannot be read as a key for {self.algorithms[0]}: {type(exc).__name__}; give "
                    "a PEM public key (-----BEGIN PUBLIC KEY-----) or an HMAC secret with HS256"
                ) from None

    @property
    def fetches(self) -> bool:
        """Whether verifying may fetch the JWKS (a network call: not on the event loop)."""
        return self.jwks is not None

    def caller(self, token: str) -> Caller:
        """The caller the token stands for; TokenRefused saying why not."""
        try:
            key = self._key if self.jwks is None else self.jwks.get_signing_key_from_jwt(token).key
            claims = jwt.decode(
                token,
                key,
                algorithms=self.algorithms,
                audience=self.audience,
                issuer=self.issuer,
                leeway=LEEWAY,
                options={"require": ["exp", "sub"], "enforce_minimum_key_length": True},
            )
        except jwt.PyJWKClientConnectionError:
            raise  # the JWKS cannot be fetched: the server's trouble, not the token's (503)
        except jwt.ExpiredSignatureError:
            raise TokenRefused("the token has expired (its exp has passed): get a new one") from None
        except jwt.ImmatureSignatureError:
            raise TokenRefused("the token is not valid yet (its nbf is ahead)") from None
        except jwt.InvalidAudienceError:
            if self.audience is None:
                raise TokenRefused("the token carries an aud, and RATCHET_JWT_AUDIENCE names none to match") from None
            raise TokenRefused(f"the token's aud is not {self.audience!r} (RATCHET_JWT_AUDIENCE)") from None
        except jwt.InvalidIssuerError:
            raise TokenRefused(f"the token's iss is not {self.issuer!r} (RATCHET_JWT_ISSUER)") from None
        except jwt.MissingRequiredClaimError as exc:
            raise TokenRefused(f"the token has no {exc.claim!r} claim: it needs exp and sub") from None
        except jwt.PyJWTError as exc:
            raise TokenRefused(f"the token does not verify ({type(exc).__name__}: {exc})") from None
        return Caller(user_id=_subject(claims), scopes=_scopes(claims))


def _subject(claims: dict[str, Any]) -> str:
    try:
        return validation.user_id(claims["sub"])
    except InvalidInputError as exc:
        raise TokenRefused(f"the token's sub is not a user_id Ratchet takes: {exc}") from None


def _scopes(claims: dict[str, Any]) -> frozenset[str]:
    """The scopes a token grants, of those Ratchet knows: `scope` (OAuth's, space-separated) or
    `scp` (a list, or a space-separated string). A token granting none is refused."""
    raw = claims.get("scope", claims.get("scp", ""))
    items = raw.split() if isinstance(raw, str) else raw if isinstance(raw, list) else []
    granted = frozenset(s for s in items if isinstance(s, str)) & SCOPES
    if not granted:
        raise TokenRefused(f"the token grants none of the scopes {', '.join(sorted(SCOPES))} (in scope or scp)")
    return granted


def caller_of(request: Request) -> Caller:
    """The request's caller, as the Gate found it; a request the Gate did not see is refused."""
    return caller_in(request.scope)


def caller_in(scope: Scope) -> Caller:
    caller = scope.get(CALLER_KEY)
    if not isinstance(caller, Caller):
        raise ApiError(401, "Unauthorized", "the request was not authenticated: send a token")
    return caller


CallerDep = Annotated[Caller, Depends(caller_of)]


def authorize(request: Request) -> None:
    """A route's scope, asked of its caller: 403 InsufficientScope naming the scope it needs,
    and 403 for a route given none in ROUTE_SCOPES (closed until it is)."""
    caller = caller_of(request)
    operation = getattr(request.scope.get("route"), "operation_id", None)
    needed = ROUTE_SCOPES.get(operation or "")
    if needed is None:
        raise ApiError(403, "NoScopeRule", f"{operation or request.url.path} has no scope rule: it is served to nobody")
    if not caller.may(needed):
        raise ApiError(
            403,
            "InsufficientScope",
            f"this needs the {needed!r} scope, which the token does not grant "
            f"(it grants {', '.join(sorted(caller.scopes))})",
            headers={"WWW-Authenticate": f'Bearer error="insufficient_scope", scope="{needed}"'},
        )


def own_run(client: Client, caller: Caller, run_id: str) -> None:
    """RunNotFoundError, as for an unknown run, unless the run is the caller's to reach."""
    if caller.admin:
        return
    record = client.store.get_record(validation.known_run_id(run_id))
    if not caller.sees(record.user_id):
        raise RunNotFoundError(f"no run with run_id {run_id!r} in this database")


def listed_user(caller: Caller, user_id: str | None) -> str | None:
    """The user_id a listing is filtered by: as asked for an admin; a user's own, whatever it
    asked, or 403 if it named another."""
    if caller.admin:
        return user_id
    if user_id is not None and user_id != caller.user_id:
        raise ApiError(
            403, "ForeignUser", f"this token acts for user_id {caller.user_id!r}: leave user_id out, or give that one"
        )
    return caller.user_id


def starting_user(caller: Caller, user_id: str | None) -> str | None:
    """The user_id a start is for: the caller's own when it names none; another's only for an
    admin (a service starts runs for whom it says)."""
    if caller.user_id is None or (caller.admin and user_id is not None):
        return user_id
    if user_id is not None and user_id != caller.user_id:
        raise ApiError(
            403, "ForeignUser", f"this token starts runs for user_id {caller.user_id!r} only: leave user_id out"
        )
    return caller.user_id


def declare_scopes(app: FastAPI, *, jwks: bool) -> None:
    """The app's schema, for an API that takes JWTs, with what a user's token can be refused
    stated on each guarded operation: 403 (the route's scope, another user named) and, with a
    JWKS, 503 (the keys cannot be fetched); and the scope each needs, as `x-ratchet-scope`."""
    stated = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = stated()
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    needed = ROUTE_SCOPES.get(operation.get("operationId", ""))
                    if needed is None:
                        continue
                    operation["x-ratchet-scope"] = needed
                    responses = operation["responses"]
                    responses.setdefault("403", {"description": "the token lacks the scope, or names another user"})
                    responses["403"].setdefault("content", error_content()["content"])
                    if jwks:
                        responses.setdefault("503", {"description": "the JWKS cannot be fetched", **error_content()})
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
