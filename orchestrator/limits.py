"""The limits every worker keeps together, which park a step instead of holding a worker.

Two kinds of limit, both checked by a model step after its claim and before its call
(`orchestrator.steps.admission`), in one call of the limiter (`ports.Limiter`; on Redis, one
round trip):

- **Runs in progress per key.** With RATCHET_MAX_RUNS_PER_KEY set, at most that many runs of
  one key are in progress at once. A run's key is its `user_id`, or what its agent's
  `concurrency_key` makes of its record (a tenant, say); a run without one is not counted, nor
  is a team's member (it runs within its team's place). A run takes its place at its first
  model step and keeps it through its steps until it ends or pauses (released by the final
  commit, the failure handler, the sweeper's poison verdict, a cancel). A release lost (the
  limiter's Redis unreachable at that moment, a worker that died between the final commit and
  the release) is made good by the sweeper: it frees the places of runs the store says ended,
  within a sweep (RATCHET_SWEEP_SECONDS) once Redis answers again (a process whose limiter saw
  it fail asks it again after LOG_EVERY, 10 s, in `workers.redis.limiter`). A place nothing renews for
  RATCHET_RUN_SLOT_SECONDS frees itself (a run this database does not hold). A run that
  finds no place is parked QUEUED and waits, in priority order then first parked, for a run of
  its key to end: that run's release gives it the place and publishes its step. The sweeper
  publishes it anyway after RATCHET_PUBLISH_GRACE_SECONDS, should that message be lost.
- **A model's rates.** A model with a `rate_limit` (`RateLimit(requests=, tokens=, per=60)`)
  makes at most that many calls and tokens per window, counted by model id across every
  worker as token buckets (a full bucket allows a burst of the whole limit). A call's tokens
  are estimated from its prompt (about 4 characters a token) and corrected with the usage the
  provider reports. A step that would go past a rate is parked for as long as the bucket needs
  to refill, published again with a countdown (or by the sweeper past RATCHET_MAX_COUNTDOWN).
  A 429 from the provider blocks the model for every worker for its Retry-After (a second
  without one), besides the run's own retry.

A parked step is not a retry (the agent's `retries` are not spent), its claim does not count
toward the poison limit, and it logs a "throttled" event in the run's log. Nothing is asked of
the limiter by a step whose run and model have no limit. A limiter that cannot reach its
Redis lets steps go unthrottled and logs a warning (it fails open).

`LocalLimiter` keeps the limits in one process: the in-memory dispatcher's, and any process
without a Redis (each then keeps its own).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.agent import AgentDefinition, find_agent
from orchestrator.errors import ConfigurationError
from orchestrator.messages import Message
from orchestrator.models.base import Model, RateLimit, ToolSpec
from orchestrator.ports import Ask, Limiter, Place, StepRef, Verdict
from orchestrator.run import RunRecord
from orchestrator.settings import Settings

#: How long a 429 without a Retry-After blocks its model.
DEFAULT_BLOCK = 1.0
#: Characters of a prompt counted as one token in a call's estimate.
CHARS_PER_TOKEN = 4


def key_of(agent: AgentDefinition | None, record: RunRecord) -> str | None:
    """The run's concurrency key: None for a team's member, else its agent's `concurrency_key`
    of the record, else its `user_id` (also when its agent is not defined in this process)."""
    if record.parent_run_id is not None:
        return None
    if agent is None or agent.concurrency_key is None:
        return record.user_id
    try:
        key = agent.concurrency_key(record)
    except Exception as exc:
        raise ConfigurationError(f"{agent.name}: its concurrency_key raised {type(exc).__name__}: {exc}") from None
    if key is not None and (not isinstance(key, str) or not key):
        raise ConfigurationError(f"{agent.name}: concurrency_key must return a non-empty str or None, got {key!r}")
    return key


def ask_for(
    settings: Settings, agent: AgentDefinition, record: RunRecord, prompt: Sequence[Message], model: Model | None = None
) -> Ask | None:
    """What the run's model step asks of the limiter before it calls `model` (the agent's own
    when None; a fallback model's for a step that fell back); None when neither limit applies
    to it (then the step asks nothing: no round trip)."""
    model = model or agent.model
    limit = settings.max_runs_per_key
    key = key_of(agent, record) if limit is not None else None
    rate = model.rate_limit
    if key is None and rate is None:
        return None
    tokens = estimate_tokens(prompt, agent.tool_specs()) if rate is not None and rate.tokens is not None else 0
    return Ask(
        run_id=record.run_id,
        key=key,
        limit=limit or 0 if key is not None else 0,
        model=model.id if rate is not None else None,
        rate=rate,
        tokens=tokens,
    )


def estimate_tokens(prompt: Sequence[Message], tools: Sequence[ToolSpec]) -> int:
    """A call's tokens before it is made: its prompt's characters (text, tool calls and
    arguments, the tools' schemas) over CHARS_PER_TOKEN, and one a message."""
    chars = sum(len(m.content or "") + len(str(m.tool_calls or "")) + len(str(m.tool_args or "")) for m in prompt)
    chars += sum(len(t.name) + len(t.description) + len(str(t.parameters)) for t in tools)
    return chars // CHARS_PER_TOKEN + len(prompt)


def used_tokens(usage: dict[str, int]) -> int | None:
    """The tokens a call used as its provider reported them; None if it reported none."""
    if "input_tokens" not in usage and "output_tokens" not in usage:
        return None
    return usage.get("input_tokens", 0) + usage.get("output_tokens", 0)


def counted(settings: Settings, record: RunRecord) -> bool:
    """Whether the run may hold a place to release: a limit is set and the run is counted
    (its agent, where this process defines it, gives it a key)."""
    if settings.max_runs_per_key is None or record.parent_run_id is not None:
        return False
    agent = find_agent(record.agent_name)
    try:
        return agent is None or key_of(agent, record) is not None
    except ConfigurationError:  # a key function that fails now: release whatever the run may hold
        return True


def release(settings: Settings, limiter: Callable[[], Limiter], record: RunRecord) -> StepRef | None:
    """The run ended or paused: free its place; the step of the run that takes it, to publish.
    `limiter` is asked for only when a limit counts the run: without limits none is built."""
    if not counted(settings, record):
        return None
    assert settings.max_runs_per_key is not None
    return limiter().release(record.run_id, settings.max_runs_per_key)


# ---------------------------------------------------------------- in one process


@dataclass
class _Bucket:
    level: float
    at: float


class LocalLimiter:
    """A `Limiter` in this process's memory (thread-safe), with the Redis one's semantics.
    `clock`: seconds, monotonic (the in-memory dispatcher adds its virtual time to it)."""

    def __init__(self, *, slot_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.slot_seconds = slot_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._slots: dict[str, dict[str, float]] = {}  # key -> run_id -> until
        self._waiting: dict[str, dict[str, tuple[tuple[int, int], StepRef]]] = {}  # key -> run_id -> (order, step)
        self._keys: dict[str, str] = {}  # run_id -> its key, while it holds or waits for a place
        self._buckets: dict[tuple[str, str], _Bucket] = {}  # (model, "requests" | "tokens")
        self._blocked: dict[str, float] = {}  # model -> until
        self._order = itertools.count()

    def admit(self, ask: Ask) -> Verdict:
        with self._lock:
            now = self.clock()
            holds = False
            if ask.key is not None and ask.limit:
                slots = self._live(ask.key, now)
                holds = ask.run_id in slots
                if holds:
                    slots[ask.run_id] = now + self.slot_seconds
                elif len(slots) >= ask.limit:
                    return Verdict(wait=max(0.0, min(slots.values()) - now), reason="concurrency")
            waits: list[tuple[float, str]] = []
            taken: list[tuple[_Bucket, int]] = []
            if ask.model is not None:
                if (blocked := self._blocked.get(ask.model, 0.0) - now) > 0:
                    waits.append((blocked, "blocked"))
                rate = ask.rate or RateLimit()
                for kind, cap, cost in (("requests", rate.requests, 1), ("tokens", rate.tokens, ask.tokens)):
                    if cap is None:
                        continue
                    bucket = self._bucket(ask.model, kind, cap, rate.per, now)
                    cost = min(cost, cap)  # a call larger than the limit goes when the bucket is full
                    if bucket.level < cost:
                        waits.append(((cost - bucket.level) * rate.per / cap, kind))
                    taken.append((bucket, cost))
            if waits:
                wait, reason = max(waits)
                return Verdict(wait=wait, reason=reason)
            for bucket, take in taken:
                bucket.level -= take
            if ask.key is not None and ask.limit and not holds:
                self._take(ask.key, ask.run_id, now)
            return Verdict()

    def wait_for_room(self, key: str, limit: int, step: StepRef) -> bool:
        with self._lock:
            now = self.clock()
            slots = self._live(key, now)
            if step.run_id in slots:
                return True
            if len(slots) < limit:
                self._take(key, step.run_id, now)
                return True
            waiting = self._waiting.setdefault(key, {})
            order = waiting[step.run_id][0] if step.run_id in waiting else (-(step.priority or 0), next(self._order))
            waiting[step.run_id] = (order, step)
            self._keys[step.run_id] = key
            return False

    def release(self, run_id: str, limit: int) -> StepRef | None:
        with self._lock:
            key = self._keys.pop(run_id, None)
            return None if key is None else self._give_up(key, run_id, limit)

    def held(self) -> list[Place]:
        with self._lock:
            return [Place(key=k, run_id=r, until=u) for k, slots in self._slots.items() for r, u in slots.items()]

    def free(self, place: Place, limit: int) -> tuple[bool, StepRef | None]:
        with self._lock:
            if self._live(place.key, self.clock()).get(place.run_id) != place.until:
                return False, None
            if self._keys.get(place.run_id) == place.key:
                del self._keys[place.run_id]
            return True, self._give_up(place.key, place.run_id, limit)

    def _give_up(self, key: str, run_id: str, limit: int) -> StepRef | None:
        """The run leaves its key's places and queue; the step of the run waiting that takes
        the place come free (the caller holds the lock)."""
        now = self.clock()
        slots = self._live(key, now)
        slots.pop(run_id, None)
        waiting = self._waiting.get(key, {})
        waiting.pop(run_id, None)
        if len(slots) >= limit or not waiting:
            return None
        first = min(waiting, key=lambda r: waiting[r][0])
        _, step = waiting.pop(first)
        self._take(key, first, now)
        return step

    def settle(self, model: str, rate: RateLimit, tokens: int) -> None:
        if rate.tokens is None or not tokens:
            return
        with self._lock:
            self._bucket(model, "tokens", rate.tokens, rate.per, self.clock()).level -= tokens

    def block(self, model: str, seconds: float) -> None:
        with self._lock:
            until = self.clock() + seconds
            self._blocked[model] = max(self._blocked.get(model, 0.0), until)

    def _live(self, key: str, now: float) -> dict[str, float]:
        """The key's places still held at `now` (expired ones dropped)."""
        slots = self._slots.setdefault(key, {})
        for run_id in [r for r, until in slots.items() if until <= now]:
            del slots[run_id]
            if run_id not in self._waiting.get(key, {}):
                self._keys.pop(run_id, None)
        return slots

    def _take(self, key: str, run_id: str, now: float) -> None:
        self._slots.setdefault(key, {})[run_id] = now + self.slot_seconds
        self._waiting.get(key, {}).pop(run_id, None)
        self._keys[run_id] = key

    def _bucket(self, model: str, kind: str, cap: int, per: float, now: float) -> _Bucket:
        """The model's bucket of `kind`, refilled up to `now` (full when new)."""
        bucket = self._buckets.setdefault((model, kind), _Bucket(level=cap, at=now))
        bucket.level = min(float(cap), bucket.level + (now - bucket.at) * cap / per)
        bucket.at = now
        return bucket
