"""All of Ratchet's configuration: one typed object read from `RATCHET_*` environment variables.

With nothing set, Ratchet runs embedded: a SQLite file and a filesystem broker under
`.ratchet/` in the working directory, so a bare machine needs no server. Production sets
`RATCHET_DATABASE_URL` (PostgreSQL) and `RATCHET_BROKER_URL` (Redis).

Time limits bound a step; the lease only detects a dead holder. A worker renews the lease of
each step it runs every RATCHET_HEARTBEAT_SECONDS (`orchestrator.heartbeat`), so the lease is
short (a killed worker's runs are taken back within a lease and a sweep) however long a step may
run. `Settings.validate_limits` enforces at start-up: soft limit < hard limit < visibility timeout
(no step outlives its broker message), and a lease of at least three heartbeats (one late beat
does not lose a claim). Keep the model timeout (plus backoff) under the soft limit too; that one
is advice, since a model may set its own timeout.

The settings that may hold a credential (`SECRET_SETTINGS`: the URLs, which may carry a password,
the API's tokens, its JWT key, the webhook secret) are read from a file too: RATCHET_<NAME>_FILE
names a file holding the value (a compose or Kubernetes secret), read when the settings are, its
trailing line break dropped.
Setting both RATCHET_<NAME> and RATCHET_<NAME>_FILE, or naming a file that cannot be read or is
empty, is a ConfigurationError that names the variable and the file, never the value. The
provider's key (OPENAI_API_KEY) is not a setting; `env_secret` reads it, or OPENAI_API_KEY_FILE,
at each call.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SecretStr, field_validator, model_validator

from orchestrator.errors import ConfigurationError

PREFIX = "RATCHET_"
DEFAULT_HOME = Path(".ratchet")
#: A lease lasts at least this many heartbeats.
LEASE_HEARTBEATS = 3
#: RATCHET_MODEL_TIMEOUT's default, also the timeout of a model call made outside a worker.
DEFAULT_MODEL_TIMEOUT = 120.0
#: The settings that may hold a credential, each read from RATCHET_<NAME>_FILE too.
SECRET_SETTINGS = (
    "database_url", "broker_url", "redis_url", "limiter_url", "api_tokens", "jwt_key", "webhook_secret",
)  # fmt: skip
#: The JWT algorithms the API may verify with (RATCHET_JWT_ALGORITHMS): never `none`.
JWT_ALGORITHMS = (
    "HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA",
)  # fmt: skip
#: The suffix of a variable that names the file holding a secret's value.
FILE_SUFFIX = "_FILE"


class Settings(BaseModel):
    """Ratchet's settings. Build with `Settings.from_env()`; every field maps to RATCHET_<NAME>."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: SQLAlchemy URL of the run store. Default: a SQLite file under .ratchet/.
    database_url: str = f"sqlite:///{DEFAULT_HOME / 'ratchet.db'}"
    #: Celery broker URL. Default: the filesystem broker (`workers.celery.filesystem`) under .ratchet/broker.
    broker_url: str = "filesystem://localhost/"
    #: Folder for the filesystem broker (only used with broker_url=filesystem://).
    broker_folder: str = str(DEFAULT_HOME / "broker")
    #: How long a claim lasts unless renewed: a worker that dies (killed, out of memory, its node
    #: lost) loses its steps this long after its last heartbeat, and the sweeper takes them back.
    lease_seconds: float = 15.0
    #: How often a worker renews the lease of every step it runs (while it lives, a step of any
    #: length keeps its claim, up to the hard time limit).
    heartbeat_seconds: float = 3.0
    #: How often the sweeper looks for expired leases, unpublished steps and pause deadlines that
    #: passed: a deadline (`pause_timeout=`) acts within this long of passing.
    sweep_seconds: float = 5.0
    #: How often a worker marks the definitions it serves as seen in the agent catalog
    #: (`orchestrator.catalog`); a definition not seen for three times this long is not live.
    catalog_seen_seconds: float = 30.0
    #: Whether each worker runs the sweeper in its main process (one of them acts at a time, by a
    #: lease in the database: `orchestrator.sweeping`). Off where `ratchet beat` sends the sweep instead.
    worker_sweeps: bool = True
    #: How long a published step may wait for a worker before the sweeper publishes it again
    #: (a lost message, a crash between commit and publish). Duplicates are harmless: the claim
    #: drops them.
    publish_grace_seconds: float = 60.0
    #: Claims of one step (crashes, hard kills) before the run goes to ERROR as a poison step.
    max_step_attempts: int = 5
    #: Soft and hard time limits of one step (Celery's task_soft_time_limit / task_time_limit).
    soft_time_limit: float = 480.0
    hard_time_limit: float = 540.0
    #: Redis visibility timeout: how long an unacked message waits before Redis redelivers it.
    visibility_timeout: float = 3600.0
    #: Timeout of one HTTP call to the model provider.
    model_timeout: float = DEFAULT_MODEL_TIMEOUT
    #: The longest a provider's Retry-After may park a run. A longer one puts the run in ERROR at
    #: once, saying so, instead of leaving it QUEUED out of sight: continue it later.
    max_retry_after: float = 900.0
    #: Waits longer than this are not spent in the task: the run is parked and the sweeper
    #: publishes it when it is due, so no worker is held and no countdown outlives the broker.
    max_countdown: float = 30.0
    #: How long the live events (text deltas) of a streamed run are kept after they were written:
    #: a Redis stream expires this long after its last write; rows of the table likewise. Durable
    #: events are rebuilt from the run's rows whatever this says.
    stream_ttl: float = 3600.0
    #: The most entries a run's Redis stream keeps (trimmed approximately, oldest first); an entry
    #: is one live event, or the events of the run one batch of the sink carried.
    stream_maxlen: int = 100_000
    #: Limits (`orchestrator.limits`): at most this many runs of one concurrency key in
    #: progress at once, across every worker. A run's key is its `user_id`, or what its agent's
    #: `concurrency_key` makes of the run; a run without one, or a team's member, is not counted.
    #: None: no limit.
    max_runs_per_key: int | None = None
    #: Bounds on the runs waiting for a worker (QUEUED), checked by every start (`orchestrator.starting`):
    #: a start is refused with QueueFullError while its agent has this many runs QUEUED (an
    #: agent's own `max_queued=` wins), or its `user_id` has this many QUEUED across agents.
    #: None: no bound. Not flow control's RATCHET_MAX_RUNS_PER_KEY, which parks runs in progress.
    max_queued_per_agent: int | None = None
    max_queued_per_user: int | None = None
    #: How long a run keeps its place among those after its last model step began without ending
    #: or pausing. A run that ended and kept it (its release lost) has it freed by the sweeper sooner.
    run_slot_seconds: float = 900.0
    #: The Redis that carries what the processes share besides the broker: streamed runs' live
    #: events (else a table of the run store), the final moves that wake waiters on SQLite (else
    #: none: they poll), and flow control's limits (RATCHET_LIMITER_URL's default). Default: the
    #: broker's URL when the broker is Redis (`_shared_redis`); "" for none.
    redis_url: str | None = None
    #: The Redis that keeps the limits every worker shares (a run's place, a model's rates), when
    #: they must live on another Redis than RATCHET_REDIS_URL's. Default: RATCHET_REDIS_URL; without
    #: either, each process keeps its own.
    limiter_url: str | None = None
    #: Whether workers send Celery's task events (received, started, succeeded) from the moment
    #: they start (`celery worker -E`), so Flower shows every step. Off, as Celery's own default,
    #: no step pays for them until a monitor asks: Flower does by itself, every few seconds, for
    #: every worker it sees (`celery -A workers.celery.app control enable_events` does once).
    task_events: bool = True
    #: Queue names.
    model_queue: str = "ratchet.model"
    tools_queue: str = "ratchet.tools"
    control_queue: str = "ratchet.control"
    #: SQLite's `PRAGMA synchronous` (WAL mode): FULL syncs the WAL at every commit, so a committed
    #: step survives an OS crash or a power loss; NORMAL syncs it only at checkpoints, and such a
    #: crash may drop the last commits (a process crash cannot); EXTRA also syncs the folder.
    sqlite_synchronous: Literal["FULL", "NORMAL", "EXTRA"] = "FULL"
    #: Apply migrations when a store is opened (the embedded default does; production runs
    #: `ratchet migrate` once).
    auto_migrate: bool = True
    #: The module(s) that define your agents, comma-separated: the default of `--app` for
    #: `ratchet worker`, `beat`, `sweep` and `run`, and what `celery -A workers.celery.app worker` imports
    #: (Celery's `imports`).
    app: str | None = None
    #: Where the domain publishes steps: the name of an installed dispatcher (the entry point
    #: group "ratchet.dispatchers": "celery" is Ratchet's), or "module:Class" of your own.
    dispatcher: str = "celery"
    #: The bearer tokens the HTTP API (`ratchet api`) accepts, separated by commas or line breaks
    #: (one a line in RATCHET_API_TOKENS_FILE; several, so a token can be rotated without
    #: downtime). A secret: shown masked, never logged. Unset, the API takes requests without a
    #: token and so serves 127.0.0.1 only.
    api_tokens: SecretStr | None = None
    #: The largest request body the HTTP API reads, in bytes: a larger one is refused with 413
    #: before it is parsed. The default leaves room for an input at its 1 MiB limit in JSON.
    api_max_body_bytes: int = 2 * 1024 * 1024
    #: The origins (`https://app.example:8443`, comma-separated) whose web pages may call the HTTP
    #: API from a browser (CORS). Unset: none but the API's own run pages; with no tokens, a page
    #: of any other origin is refused (`workers.api.loopback`).
    api_cors_origins: str | None = None
    #: The key the HTTP API verifies JSON Web Tokens with (`workers.api.access`): a PEM public
    #: key (RSA, EC, Ed25519) or an HMAC secret of 32 bytes or more. A secret: masked, never
    #: logged, readable from RATCHET_JWT_KEY_FILE. A token's `sub` is the user it acts for.
    jwt_key: SecretStr | None = None
    #: Instead of a key: the URL of a JWKS (an identity provider's `jwks_uri`), its keys chosen by
    #: a token's `kid` and cached for five minutes.
    jwt_jwks_url: str | None = None
    #: The algorithms a token may be signed with, comma-separated. Default: HS256 for a secret,
    #: RS256 for a PEM key or a JWKS. `none` is never taken, nor HMAC with a public key.
    jwt_algorithms: str | None = None
    #: The `aud` a token must carry (unset: a token with an `aud` is refused, as PyJWT does).
    jwt_audience: str | None = None
    #: The `iss` a token must carry (unset: not checked).
    jwt_issuer: str | None = None
    #: The key webhook deliveries are signed with (HMAC-SHA256, `orchestrator.webhooks`). A
    #: secret: masked, never logged, readable from RATCHET_WEBHOOK_SECRET_FILE. Unset, a start
    #: with a webhook is refused: an unsigned delivery could not be told from a forged one.
    webhook_secret: SecretStr | None = None
    #: The hosts and networks webhooks may be sent to besides public addresses, comma-separated
    #: (`hooks.internal`, `10.0.0.0/8`, `127.0.0.1`). Loopback, private, link-local (cloud
    #: metadata included) and other non-public addresses are refused unless listed here.
    webhook_allow: str | None = None
    #: How many times a delivery is tried before it is marked failed.
    webhook_max_attempts: int = 8
    #: The first retry's delay in seconds; each next one doubles it (with jitter), up to an hour.
    webhook_backoff_seconds: float = 5.0
    #: How long one delivery's POST may take, in seconds.
    webhook_timeout_seconds: float = 10.0

    @model_validator(mode="before")
    @classmethod
    def _shared_redis(cls, values: object) -> object:
        """The one place the Redis URLs get their defaults: RATCHET_REDIS_URL is the broker's when
        the broker is Redis, and RATCHET_LIMITER_URL is RATCHET_REDIS_URL. Done here, not when the
        adapters are built, so that which Redis (if any) a process shares is read off its
        settings; "" sets none."""
        if not isinstance(values, dict):
            return values
        values = dict(values)
        if "redis_url" not in values:
            broker = str(values.get("broker_url", cls.model_fields["broker_url"].default))
            values["redis_url"] = broker if broker.startswith(("redis://", "rediss://")) else None
        if values.get("limiter_url") is None:
            values["limiter_url"] = values["redis_url"]
        for name in ("redis_url", "limiter_url"):
            values[name] = values[name] or None
        return values

    @field_validator("sqlite_synchronous", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def validate_limits(self) -> Settings:
        """Refuse limits that would let a step outlive its broker message or lose its claim to
        one late heartbeat."""
        chain = [
            ("RATCHET_SOFT_TIME_LIMIT", self.soft_time_limit),
            ("RATCHET_HARD_TIME_LIMIT", self.hard_time_limit),
            ("RATCHET_VISIBILITY_TIMEOUT", self.visibility_timeout),
        ]
        for (lo_name, lo), (hi_name, hi) in itertools.pairwise(chain):
            if not lo < hi:
                raise ValueError(f"{lo_name} ({lo}) must be less than {hi_name} ({hi})")
        if self.heartbeat_seconds <= 0:
            raise ValueError("RATCHET_HEARTBEAT_SECONDS must be positive")
        if self.lease_seconds < LEASE_HEARTBEATS * self.heartbeat_seconds:
            raise ValueError(
                f"RATCHET_LEASE_SECONDS ({self.lease_seconds}) must be at least {LEASE_HEARTBEATS} times "
                f"RATCHET_HEARTBEAT_SECONDS ({self.heartbeat_seconds}), so that one late heartbeat does not "
                "lose a running step's claim"
            )
        if self.max_countdown > self.visibility_timeout:
            # A countdown'd task waits unacked in a worker; past the visibility timeout Redis
            # hands it out again, over and over (kombu#337): longer waits belong to the sweeper.
            raise ValueError(
                f"RATCHET_MAX_COUNTDOWN ({self.max_countdown}) must not exceed RATCHET_VISIBILITY_TIMEOUT "
                f"({self.visibility_timeout})"
            )
        if self.max_step_attempts < 1:
            raise ValueError("RATCHET_MAX_STEP_ATTEMPTS must be at least 1")
        if self.sweep_seconds <= 0 or self.catalog_seen_seconds <= 0:
            raise ValueError("RATCHET_SWEEP_SECONDS and RATCHET_CATALOG_SEEN_SECONDS must be positive")
        if self.api_max_body_bytes < 1:
            raise ValueError("RATCHET_API_MAX_BODY_BYTES must be positive")
        if self.webhook_max_attempts < 1 or self.webhook_backoff_seconds <= 0 or self.webhook_timeout_seconds <= 0:
            raise ValueError(
                "RATCHET_WEBHOOK_MAX_ATTEMPTS, RATCHET_WEBHOOK_BACKOFF_SECONDS and RATCHET_WEBHOOK_TIMEOUT_SECONDS "
                "must be positive"
            )
        for entry in self.webhook_allow_values:
            _check_allow_entry(entry)
        if self.stream_ttl <= 0 or self.stream_maxlen < 1:
            raise ValueError("RATCHET_STREAM_TTL and RATCHET_STREAM_MAXLEN must be positive")
        for origin in self.api_cors_origin_values:
            scheme, _, rest = origin.partition("://")
            if scheme not in ("http", "https") or not rest or "/" in rest or "*" in rest:
                raise ValueError(
                    f"RATCHET_API_CORS_ORIGINS: {origin!r} is not an origin; list each as scheme://host[:port] "
                    "(e.g. https://app.example), comma-separated, without a path or a wildcard"
                )
        return self

    @model_validator(mode="after")
    def validate_flow(self) -> Settings:
        """Refuse a limit of no runs, and a run's place that a step could outlive."""
        if self.max_runs_per_key is not None and self.max_runs_per_key < 1:
            raise ValueError("RATCHET_MAX_RUNS_PER_KEY must be at least 1 (unset it for no limit)")
        for name, bound in (("AGENT", self.max_queued_per_agent), ("USER", self.max_queued_per_user)):
            if bound is not None and bound < 1:
                raise ValueError(f"RATCHET_MAX_QUEUED_PER_{name} must be at least 1 (unset it for no bound)")
        if not self.run_slot_seconds > self.hard_time_limit:
            raise ValueError(
                f"RATCHET_RUN_SLOT_SECONDS ({self.run_slot_seconds}) must exceed RATCHET_HARD_TIME_LIMIT "
                f"({self.hard_time_limit}): a step must not outlive its run's place"
            )
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read every `RATCHET_*` variable; unknown ones are an error, not a silent typo."""
        env = os.environ if environ is None else environ
        fields = cls.model_fields
        values: dict[str, str] = {}
        for key, value in env.items():
            if not key.startswith(PREFIX):
                continue
            name = key[len(PREFIX) :].lower()
            if name in fields:
                values[name] = value
            elif name.removesuffix(FILE_SUFFIX.lower()) in SECRET_SETTINGS:
                pass  # read below, with the variable it stands for
            elif name not in _NOT_SETTINGS:
                known = ", ".join(PREFIX + f.upper() for f in fields)
                from_files = ", ".join(PREFIX + f.upper() + FILE_SUFFIX for f in SECRET_SETTINGS)
                raise ConfigurationError(
                    f"unknown setting {key}; known settings: {known}; read from a file: {from_files}"
                )
        for name in SECRET_SETTINGS:
            if (from_file := secret_from_file(PREFIX + name.upper(), env)) is not None:
                values[name] = from_file
        try:
            return cls.model_validate(values)
        except ValueError as exc:
            raise ConfigurationError(f"invalid Ratchet settings: {exc}") from None

    @model_validator(mode="after")
    def validate_api_tokens(self) -> Settings:
        """Refuse a token with whitespace inside (`tok a`): no client could send it as a bearer
        token, and it is most likely two tokens run together. Raised as a ConfigurationError, not a
        ValueError, so that pydantic's message, which quotes the input, never shows a token."""
        if any(not token.isprintable() or any(c.isspace() for c in token) for token in self.api_token_values):
            raise ConfigurationError(
                "RATCHET_API_TOKENS (or RATCHET_API_TOKENS_FILE): a token holds whitespace or a control "
                "character; separate the tokens with commas or line breaks, each without spaces, tabs or "
                "control characters inside"
            )
        return self

    @model_validator(mode="after")
    def validate_jwt(self) -> Settings:
        """Refuse a JWT configuration that could not verify a token, or would verify one it should
        not: a key and a JWKS at once, HMAC with a public key or a JWKS, a key of another family
        than its algorithms, a secret too short for its hash. Said without the key."""
        key = None if self.jwt_key is None else self.jwt_key.get_secret_value()
        if key is not None and self.jwt_jwks_url:
            raise ConfigurationError("RATCHET_JWT_KEY and RATCHET_JWT_JWKS_URL are both set: set one of them")
        if key is None and not self.jwt_jwks_url:
            if self.jwt_algorithms or self.jwt_audience or self.jwt_issuer:
                raise ConfigurationError(
                    "RATCHET_JWT_ALGORITHMS, _AUDIENCE and _ISSUER need RATCHET_JWT_KEY or RATCHET_JWT_JWKS_URL: "
                    "set the key (or JWKS URL) tokens are verified with"
                )
            return self
        algorithms = self.jwt_algorithm_values
        unknown = [a for a in algorithms if a not in JWT_ALGORITHMS]
        if unknown or not algorithms:
            raise ConfigurationError(
                f"RATCHET_JWT_ALGORITHMS: {', '.join(unknown) or 'none given'}; "
                f"give some of {', '.join(JWT_ALGORITHMS)}"
            )
        hmac = [a for a in algorithms if a.startswith("HS")]
        pem = key is not None and key.lstrip().startswith("-----BEGIN")
        if hmac and (pem or self.jwt_jwks_url):
            raise ConfigurationError(
                f"RATCHET_JWT_ALGORITHMS: {', '.join(hmac)} (HMAC) with a public key or a JWKS would take a token "
                "signed with the public key as its secret: give RS256, ES256, PS256 or EdDSA, or an HMAC secret"
            )
        if key is not None and not pem and len(hmac) != len(algorithms):
            raise ConfigurationError(
                "RATCHET_JWT_KEY is not a PEM public key (-----BEGIN PUBLIC KEY-----), so it is an HMAC secret: "
                "give RATCHET_JWT_ALGORITHMS as HS256, HS384 or HS512, or give the PEM key"
            )
        if key is not None and not pem and len(key.encode()) < 32:
            raise ConfigurationError(
                "RATCHET_JWT_KEY: an HMAC secret must be 32 bytes or more (e.g. `openssl rand -hex 32`)"
            )
        if self.jwt_jwks_url and not self.jwt_jwks_url.startswith(("https://", "http://")):
            raise ConfigurationError("RATCHET_JWT_JWKS_URL: give the https:// URL of the JWKS")
        return self

    @property
    def jwt_algorithm_values(self) -> tuple[str, ...]:
        """RATCHET_JWT_ALGORITHMS split at commas; unset, HS256 for a secret, RS256 for a PEM key
        or a JWKS; empty when JWTs are not taken."""
        if self.jwt_algorithms:
            return tuple(a.strip() for a in self.jwt_algorithms.split(",") if a.strip())
        if self.jwt_key is None:
            return ("RS256",) if self.jwt_jwks_url else ()
        return ("RS256",) if self.jwt_key.get_secret_value().lstrip().startswith("-----BEGIN") else ("HS256",)

    @property
    def api_auth(self) -> bool:
        """Whether the HTTP API asks who calls it: static tokens or JWTs are configured. Without,
        it takes any request, and so serves 127.0.0.1 only."""
        return bool(self.api_token_values) or self.jwt_key is not None or bool(self.jwt_jwks_url)

    @property
    def api_token_values(self) -> tuple[str, ...]:
        """The API's bearer tokens: RATCHET_API_TOKENS (or its file) split at commas and line breaks,
        each stripped, blanks dropped; empty when none is set. Read only to compare a request's
        token with them."""
        if self.api_tokens is None:
            return ()
        parts = self.api_tokens.get_secret_value().replace(",", "\n").splitlines()
        return tuple(t for t in (part.strip() for part in parts) if t)

    @property
    def api_cors_origin_values(self) -> tuple[str, ...]:
        """RATCHET_API_CORS_ORIGINS split at commas, each as a browser writes an Origin (lower case,
        no trailing slash, no default port), so the guard and CORS match it alike; empty when unset."""
        parts = (_as_origin(p) for p in (self.api_cors_origins or "").split(","))
        return tuple(p for p in parts if p)

    @property
    def webhook_allow_values(self) -> tuple[str, ...]:
        """RATCHET_WEBHOOK_ALLOW split at commas, stripped; empty when unset."""
        return tuple(p.strip() for p in (self.webhook_allow or "").split(",") if p.strip())

    @property
    def is_embedded_broker(self) -> bool:
        """True for brokers that need no server (filesystem, memory)."""
        return self.broker_url.split("://", 1)[0] in {"filesystem", "memory"}

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        """What `repr()` and `str()` show (and so a log line or a traceback's locals): every
        setting, with a URL's password replaced by `***` (the API's tokens are a SecretStr already)."""
        for name, value in super().__repr_args__():
            yield name, shown_url(value) if name in SECRET_SETTINGS and isinstance(value, str) else value


def shown_url(url: str) -> str:
    """`url` with the password of its user part, and the value of every query parameter, replaced
    by `***` (a driver takes a password, a token or a TLS key's passphrase there too)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    rest, mark, query = rest.partition("?")
    userinfo, at, host = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.split(':', 1)[0]}:***@{host}"
    if mark:
        query = "&".join(f"{part.partition('=')[0]}=***" if "=" in part else part for part in query.split("&"))
    return f"{scheme}://{rest}{mark}{query}"


def _as_origin(value: str) -> str:
    """An origin as a browser sends it: `HTTPS://App.example:443/` -> `https://app.example`."""
    origin = value.strip().rstrip("/").lower()
    for scheme, port in (("http://", ":80"), ("https://", ":443")):
        if origin.startswith(scheme) and origin.endswith(port):
            return origin.removesuffix(port)
    return origin


# RATCHET_-prefixed variables that are read elsewhere on purpose and are not settings.
_NOT_SETTINGS = {"test_database_url", "test_redis_url", "test_pg_url", "test_amqp_url"}


def env_secret(name: str) -> str | None:
    """Read a secret (an API key) from the environment at the moment it is needed: `name`, or the
    file `name`_FILE names (read again at each call, so a rotated file takes effect at once).

    Secrets are not settings: they are never copied into a Settings object, a run row, a task
    or a log line, and reading them late means fixing a key on the workers takes effect on the
    next call without a restart. Both set, or a file that cannot be read: ConfigurationError.
    """
    from_file = secret_from_file(name, os.environ)
    return from_file if from_file is not None else os.environ.get(name) or None


def secret_from_file(name: str, env: Mapping[str, str]) -> str | None:
    """The value of the file `name`_FILE names in `env` (its trailing line break dropped), or None
    when that variable is unset or empty. ConfigurationError, naming the variables and the file but
    never the value, when `name` is set too, or the file cannot be read as text or is empty."""
    var = name + FILE_SUFFIX
    path = env.get(var)
    if not path:
        return None
    if env.get(name):
        raise ConfigurationError(
            f"{name} and {var} are both set: set one of them (the value, or the path of a file holding it)"
        )
    try:
        value = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise ConfigurationError(f"{var}: cannot read {path!r}: {exc.strerror or type(exc).__name__}") from None
    except UnicodeDecodeError:
        raise ConfigurationError(f"{var}: {path!r} is not UTF-8 text") from None
    if not value:
        raise ConfigurationError(f"{var}: {path!r} is empty: write the value of {name} in it")
    return value


def env_value(name: str) -> str | None:
    """Read a non-Ratchet variable that a third-party convention defines (OPENAI_BASE_URL)."""
    return os.environ.get(name) or None


def _check_allow_entry(entry: str) -> None:
    """An entry of RATCHET_WEBHOOK_ALLOW that looks like an address or a network must be one: a
    typo (`10.0.0.0/33`) would otherwise be taken for a host name and allow nothing it meant to."""
    if "/" not in entry and ":" not in entry and not entry.replace(".", "").isdigit():
        return  # a host name
    try:
        ipaddress.ip_network(entry, strict=False)
    except ValueError as exc:
        raise ValueError(
            f"RATCHET_WEBHOOK_ALLOW entry {entry!r} is not an address or network ({exc}): write an address, "
            "a network such as 10.0.0.0/8 or fd00::/8, or a host name"
        ) from None
