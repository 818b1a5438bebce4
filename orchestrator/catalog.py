"""The agent catalog: what workers serve, as data, so a process that does not import an agent
still knows it.

Each worker writes the definitions it serves when it boots, and marks them seen every
RATCHET_CATALOG_SEEN_SECONDS while it lives (`CatalogKeeper`). A definition is described from
the public attributes of its `Agent` or `Team` (`describe`): name, kind, model (provider and
id), a digest of its system message, its tools with their JSON schemas and flags, its members,
its output schema, its queues, its spending limits, its fallback models, its runs' deadline and
the bound on its QUEUED runs (those set). The
definition hash is the SHA-256 of that description as canonical JSON (keys sorted, no spaces),
so the same definition hashes the same in every process and every version of Ratchet that
describes it alike. A tool's
flags hold only those it sets, so a flag added later leaves the hash of every definition that
does not use it as it was (budgets too: a definition without one describes none).

Rows are keyed by name and hash: an old and a new version of one agent, served side by side
during a deploy, are two entries. An entry is live while a worker saw it within three of those
intervals (`live_seconds`); one that no live worker serves says when it was last seen.

A producer that does not import an agent routes its run's first step by the live definition
(the one seen most recently, if live): its kind and queues, read once per `CACHE_SECONDS` per
process (`DefinitionCache`). Without one it publishes the step unrouted, and the worker that
takes it sends it on (`StepRunner.reroute`). Each run stores the hash of the definition it
started with (`RunRecord.definition_hash`): the producer's own when it imports the agent, else
the live one's; each step, the hash of its worker's. What a worker does with a run of another
definition than its own is `orchestrator.deploys`'s.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.agent import AgentDefinition, find_agent, registered
from orchestrator.forks import unforked
from orchestrator.requirements import pause_type_of
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.store.catalog_rows import CatalogRow, Served

log = logging.getLogger("ratchet.catalog")

#: How many seen-intervals a definition stays live after a worker last marked it.
LIVE_INTERVALS = 3
#: How long a producer process keeps what it read of the catalog for one agent name.
CACHE_SECONDS = 5.0


@dataclass(frozen=True, kw_only=True)
class ToolDefinition:
    """One tool as the catalog describes it: what the model is shown, and its flags."""

    name: str
    description: str
    #: The JSON schema of its arguments, as the model sees it.
    parameters: dict[str, Any]
    #: The flags it sets (`at_most_once`, `queue`, ...); a flag at its default is left out.
    flags: dict[str, Any]

    @property
    def queue(self) -> str | None:
        """The queue its batches go to (None: the agent's)."""
        queue = self.flags.get("queue")
        return queue if isinstance(queue, str) else None

    @property
    def pause_type(self) -> str | None:
        """What a call of it pauses for, as `Tool.pause_type` says (None: it runs)."""
        return pause_type_of(
            external_execution=bool(self.flags.get("external_execution")),
            requires_user_input=bool(self.flags.get("requires_user_input")),
            requires_confirmation=bool(self.flags.get("requires_confirmation")),
        )

    @property
    def user_input_fields(self) -> list[str]:
        """The parameters a person fills in, as `Tool.user_input_fields` (set with `requires_user_input`)."""
        return list(self.flags.get("user_input_fields") or [])


@dataclass(frozen=True, kw_only=True)
class Definition:
    """An agent or team as the catalog describes it, with its definition hash."""

    name: str
    kind: str
    #: {"provider": ..., "id": ...} (the provider None when the model does not say it).
    model: dict[str, str | None]
    #: SHA-256 (hex) of the system message a new run gets (None: it gets none).
    instructions_digest: str | None
    tools: tuple[ToolDefinition, ...]
    #: The names of a team's members, in order (none for an agent).
    members: tuple[str, ...]
    #: The JSON schema of the final answer (None: text).
    output_schema: dict[str, Any] | None
    #: The queue of its steps, and of its tool batches that call a routed tool (None: defaults).
    queue: str | None
    tool_queue: str | None
    #: SHA-256 (hex) of `to_json()`.
    hash: str
    #: Its spending limits by scope, {"run": {"max_cost": 0.5}, "session": {...}} (`orchestrator.budgets`);
    #: {} without any, and then left out of the description, so its hash is as before budgets.
    budgets: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Its fallback models by list ("on_error", "on_rate_limit", "on_context_overflow"), each
    #: [{"provider": ..., "id": ...}] in order (`orchestrator.models.fallback`); {} without any,
    #: and then left out of the description, so its hash is as before fallbacks.
    fallback_models: dict[str, list[dict[str, str | None]]] = field(default_factory=dict)
    #: The deadline its runs get and the most of them QUEUED for a start to be taken
    #: (`Agent(run_timeout=, max_queued=)`); None, and then left out of the description: none.
    run_timeout: float | None = None
    max_queued: int | None = None

    def body(self) -> dict[str, Any]:
        """The description the hash is taken over, as JSON values."""
        body: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "model": dict(self.model),
            "instructions_digest": self.instructions_digest,
            "tools": [
                {"name": t.name, "description": t.description, "parameters": t.parameters, "flags": t.flags}
                for t in self.tools
            ],
            "members": list(self.members),
            "output_schema": self.output_schema,
            "queues": {"steps": self.queue, "tools": self.tool_queue},
        }
        if self.budgets:
            body["budgets"] = {scope: dict(limits) for scope, limits in self.budgets.items()}
        if self.fallback_models:
            body["fallback_models"] = {k: [dict(m) for m in ms] for k, ms in self.fallback_models.items()}
        for name in ("run_timeout", "max_queued"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        return body

    def to_json(self) -> str:
        """The description as canonical JSON: what is stored, and what is hashed."""
        return canonical(self.body())

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Definition:
        """A definition from its description (as `body` returns it), hashed."""
        queues = body.get("queues") or {}
        definition = cls(
            name=body["name"],
            kind=body["kind"],
            model={"provider": body["model"].get("provider"), "id": body["model"].get("id")},
            instructions_digest=body.get("instructions_digest"),
            tools=tuple(
                ToolDefinition(
                    name=t["name"], description=t["description"], parameters=t["parameters"], flags=t["flags"]
                )
                for t in body.get("tools", [])
            ),
            members=tuple(body.get("members", [])),
            output_schema=body.get("output_schema"),
            queue=queues.get("steps"),
            tool_queue=queues.get("tools"),
            hash="",
            budgets={scope: dict(limits) for scope, limits in (body.get("budgets") or {}).items()},
            fallback_models={
                k: [{"provider": m.get("provider"), "id": m.get("id")} for m in ms]
                for k, ms in (body.get("fallback_models") or {}).items()
            },
            run_timeout=body.get("run_timeout"),
            max_queued=body.get("max_queued"),
        )
        return _hashed(definition)

    @classmethod
    def from_json(cls, text: str) -> Definition:
        """A definition from its stored JSON."""
        return cls.from_body(json.loads(text))

    def served(self) -> Served:
        """The row a worker that serves it writes."""
        return Served(name=self.name, definition_hash=self.hash, kind=self.kind, definition=self.to_json())


@dataclass(frozen=True, kw_only=True)
class Entry:
    """A catalog entry: a definition, when workers first and last served it, and whether one
    still does (`live`: seen within `live_seconds`)."""

    definition: Definition
    first_seen: float
    last_seen: float
    live: bool


def canonical(value: Any) -> str:
    """JSON with sorted keys and no spaces: the same text for the same value in every process."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _hashed(definition: Definition) -> Definition:
    digest = hashlib.sha256(definition.to_json().encode()).hexdigest()
    return Definition(**{**definition.__dict__, "hash": digest})


_described: dict[int, tuple[AgentDefinition, Definition]] = {}
_described_lock = threading.Lock()


def describe(agent: AgentDefinition) -> Definition:
    """The catalog's description of `agent`, from its public attributes; computed once per
    definition object (a producer that imports the agent pays it on its first start only)."""
    with _described_lock:
        known = _described.get(id(agent))
    if known is not None and known[0] is agent:
        return known[1]
    definition = Definition.from_body(_body_of(agent))
    with _described_lock:
        _described[id(agent)] = (agent, definition)
    return definition


def _body_of(agent: AgentDefinition) -> dict[str, Any]:
    system = agent.render_system_message()
    schema = agent.output_schema.model_json_schema() if agent.output_schema is not None else None
    return {
        "name": agent.name,
        "kind": agent.kind,
        "model": {"provider": agent.model.provider, "id": agent.model.id},
        "instructions_digest": hashlib.sha256(system.encode()).hexdigest() if system is not None else None,
        "tools": [
            {
                "name": t.spec.name,
                "description": t.spec.description,
                "parameters": t.spec.parameters,
                "flags": _flags(t),
            }
            for t in agent.tools
        ],
        "members": [m.name for m in getattr(agent, "members", [])],
        "output_schema": schema,
        "queues": {"steps": agent.queue, "tools": agent.tool_queue},
        "budgets": agent.budgets.to_json(),
        "fallback_models": agent.fallback.describe(),
        "run_timeout": agent.run_timeout,
        "max_queued": agent.max_queued,
    }


def _flags(tool: Any) -> dict[str, Any]:
    """The flags a tool sets (at their default they are left out, so the hash does not move when
    a flag is added). The human-in-the-loop flags join these."""
    flags: dict[str, Any] = {}
    if tool.at_most_once:
        flags["at_most_once"] = True
    if tool.queue is not None:
        flags["queue"] = tool.queue
    for name in ("requires_confirmation", "requires_user_input", "external_execution"):
        if getattr(tool, name, False):
            flags[name] = True
    if getattr(tool, "requires_user_input", False):
        flags["user_input_fields"] = list(tool.user_input_fields)
    policy = getattr(tool, "pause_policy", None)
    if policy is not None:
        flags["pause_timeout"] = policy.timeout
        flags["on_timeout"] = policy.on_timeout
    return flags


# ---------------------------------------------------------------- reading


def live_seconds(settings: Settings) -> float:
    """How long after a worker last marked a definition it counts as live."""
    return LIVE_INTERVALS * settings.catalog_seen_seconds


def entry_of(row: CatalogRow, *, now: float, window: float) -> Entry:
    """A catalog row as an entry, live if seen within `window` of `now`."""
    return Entry(
        definition=Definition.from_json(row.definition),
        first_seen=row.first_seen,
        last_seen=row.last_seen,
        live=row.last_seen >= now - window,
    )


def entries(store: Store, settings: Settings, name: str | None = None) -> list[Entry]:
    """Every catalog entry (those of `name` only, if given): by name, most recently seen first."""
    now, window = store.clock(), live_seconds(settings)
    return [entry_of(r, now=now, window=window) for r in store.catalog.read(name)]


def known(store: Store, name: str) -> bool:
    """Whether an agent or team `name` is known to this deployment: this process defines it, or
    a worker served it once (an entry in the catalog, live or not: a worker that serves it may
    come back). A producer that asks before it writes a run refuses one that nothing would ever
    run, rather than writing a run that fails on the worker (`ratchet run`)."""
    return find_agent(name) is not None or store.catalog.latest(name) is not None


class DefinitionCache:
    """The live definitions a producer process read, by name, each kept `CACHE_SECONDS`
    (an agent no worker serves too, so a producer without one reads once in that time)."""

    def __init__(self, store: Store, *, seconds: float = CACHE_SECONDS) -> None:
        self.store = store
        self.seconds = seconds
        self._read: dict[str, tuple[float, CatalogRow | None]] = {}

    def live(self, name: str, settings: Settings) -> Definition | None:
        """The definition of `name` seen most recently, if it is live; None otherwise."""
        now = time.monotonic()
        cached = self._read.get(name)
        if cached is None or now - cached[0] >= self.seconds:
            cached = (now, self.store.catalog.latest(name))
            self._read[name] = cached
        row = cached[1]
        if row is None:
            return None
        entry = entry_of(row, now=self.store.clock(), window=live_seconds(settings))
        return entry.definition if entry.live else None


_caches: weakref.WeakKeyDictionary[Store, DefinitionCache] = weakref.WeakKeyDictionary()


def cache_of(store: Store) -> DefinitionCache:
    """This process's catalog cache for `store`."""
    cache = _caches.get(store)
    if cache is None:
        cache = _caches.setdefault(store, DefinitionCache(store))
    return cache


# ---------------------------------------------------------------- writing


def contested(store: Store, settings: Settings, served: Sequence[Definition]) -> list[Definition]:
    """Those of the `served` definitions whose agent has another definition live (a deploy in
    progress: workers of two versions side by side), read in one query."""
    own = {d.name: d.hash for d in served}
    rows = store.catalog.read(since=store.clock() - live_seconds(settings))
    rivals = {r.name for r in rows if own.get(r.name) not in (None, r.definition_hash)}
    return [d for d in served if d.name in rivals]


def write_served(store: Store, agents: Sequence[AgentDefinition]) -> list[Definition]:
    """Write the definitions of `agents` as served, seen now; returns them."""
    definitions = [describe(a) for a in agents]
    store.catalog.write([d.served() for d in definitions])
    return definitions


class CatalogKeeper:
    """Writes what this process serves into the catalog at start, then again (marking it seen)
    every RATCHET_CATALOG_SEEN_SECONDS from a thread of its own, until stopped. A failed write is
    logged and tried again at the next interval: the catalog never stops a worker.

    `rivals`, if given, is called after each write with the definitions served whose agent has
    another definition live (`contested`): a worker then takes the steps handed on to its own
    (`orchestrator.deploys`) from then on."""

    def __init__(
        self,
        store: Callable[[], Store],
        settings: Settings,
        agents: Callable[[], Sequence[AgentDefinition]] = registered,
        rivals: Callable[[list[Definition]], None] | None = None,
    ) -> None:
        #: Opens the store at the first write, not before: a worker starts while its database is down.
        self.store = store
        self.settings = settings
        self.agents = agents
        self.rivals = rivals
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def write(self) -> list[Definition]:
        """Write (or mark seen) every definition served now; [] when the write failed."""
        try:
            with unforked():  # a pool process forked mid-write would inherit its locks held
                store = self.store()
                written = write_served(store, self.agents())
                if self.rivals is not None and written:
                    self.rivals(contested(store, self.settings, written))
                return written
        except Exception:
            log.exception("could not write the agent catalog; trying again in %ss", self.settings.catalog_seen_seconds)
            return []

    def start(self) -> CatalogKeeper:
        """Write the catalog now and keep it marked seen."""
        written = self.write()
        log.info("agent catalog: serving %s", ", ".join(f"{d.name} ({d.hash[:12]})" for d in written) or "nothing")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, args=(self._stop,), name="ratchet-catalog", daemon=True)
        self._thread.start()
        return self

    def _keep(self, stop: threading.Event) -> None:
        while not stop.wait(self.settings.catalog_seen_seconds):
            self.write()

    def stop(self) -> None:
        """Stop marking the definitions seen (they go stale after `live_seconds`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
