"""The limiter on Redis (`orchestrator.ports.Limiter`): the limits, shared by every
worker, each check one atomic Lua script, so one round trip (`orchestrator.limits` says what the
limits mean).

Keys, under `ratchet:flow:` (named when the limits were called flow control, and kept so that
workers of older and newer versions share them), each expiring once it has nothing left to say:

- `slots:{key}`: a sorted set of the runs of a concurrency key in progress, scored by when
  their place expires (RATCHET_RUN_SLOT_SECONDS after their last model step began);
- `waiting:{key}` and `steps:{key}`: the runs parked for want of a place, scored by priority
  then arrival, and the step to publish for each;
- `run:{run_id}`: the key whose place the run holds or waits for, so a release (a cancel by a
  producer that does not define the agent too) needs only the run's id;
- `requests:{model}` and `tokens:{model}`: token buckets (level, last update), refilled at
  limit/window; `blocked:{model}`: set for a 429's Retry-After;
- `keys`: the set of concurrency keys in which a run took a place (added by its first take, not
  by each step's renewal), which the sweeper reads (`held`) to free the places of runs that
  ended while their release could not reach Redis (`free`); a key whose places are all gone
  leaves it at that read (the set has no expiry of its own).

Times are Redis's own (`TIME`), so workers' clocks need not agree. A call's token correction
(`settle`) waits in this process and goes with its next `admit` of that model, in the same round
trip, and counts whatever that admit's verdict (kept for the next one when the call fails; one
that timed out after Redis had run it counts it twice). A Redis that fails or does not answer
within LIMITER_TIMEOUT lets the step go unthrottled (fails open), logged at most every LOG_EVERY
seconds; for LOG_EVERY seconds after a failure it is not asked at all, so a Redis that hangs
costs one timeout, not one a step.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import redis

from orchestrator.models.base import RateLimit
from orchestrator.ports import Ask, Place, StepKind, StepRef, Verdict
from orchestrator.settings import Settings

log = logging.getLogger("ratchet.limiter")
PREFIX = "ratchet:flow:"
#: Seconds a limiter call may take before the step goes on unthrottled.
LIMITER_TIMEOUT = 2.0
#: The least seconds between two warnings that Redis failed a limiter call.
LOG_EVERY = 10.0
#: Keys whose places `held` reads in one round trip.
HELD_BATCH = 500

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

#: `index`: the set of keys with places (`RedisLimiter.held` lists them), on a run's first take
#: only, not on the renewal of each of its steps; false on a renewal.
_TAKE = """
local function take(slots, map, run, key, slot_ms, waiting, steps, index)
  redis.call('ZADD', slots, now + slot_ms, run)
  redis.call('PEXPIRE', slots, slot_ms)
  redis.call('SET', map, key, 'PX', slot_ms)
  redis.call('ZREM', waiting, run)
  redis.call('HDEL', steps, run)
  if index then redis.call('SADD', index, key) end
end
"""

#: The place a run gave up goes to the first run waiting that still has a step, if there is room.
_WAKE = """
local function wake(slots, waiting, steps, key, limit, slot_ms, prefix)
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
  if redis.call('ZCARD', slots) >= limit then return false end
  while true do
    local first = redis.call('ZPOPMIN', waiting)
    if #first == 0 then return false end
    local step = redis.call('HGET', steps, first[1])
    if step then
      take(slots, prefix .. 'run:' .. first[1], first[1], key, slot_ms, waiting, steps, prefix .. 'keys')
      return step
    end
  end
end
"""

#: KEYS: slots, run map, requests, tokens, blocked, waiting, steps, index.
#: ARGV: run_id, key, limit, slot_ms, requests cap, tokens cap, window ms, tokens cost, tokens adjust.
ADMIT = (
    _NOW
    + _TAKE
    + """
local run, key = ARGV[1], ARGV[2]
local limit, slot_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local req_cap, tok_cap, per = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local tok_cost, tok_adjust = math.min(tonumber(ARGV[8]), tok_cap), tonumber(ARGV[9])
local function level(k, cap)
  local v = redis.call('HMGET', k, 'l', 't')
  local l, at = tonumber(v[1]), tonumber(v[2])
  if l == nil then return cap end
  return math.min(cap, l + (now - at) * cap / per)
end
local function save(k, l, cap)
  redis.call('HSET', k, 'l', tostring(l), 't', now)
  redis.call('PEXPIRE', k, math.ceil((cap - l) * per / cap) + per)
end
local holds = false
if limit > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  holds = redis.call('ZSCORE', KEYS[1], run) ~= false
  if holds then
    take(KEYS[1], KEYS[2], run, key, slot_ms, KEYS[6], KEYS[7], false)
  elseif redis.call('ZCARD', KEYS[1]) >= limit then
    -- The call's correction counts whatever the verdict: the process that sent it forgets it
    if tok_cap > 0 and tok_adjust ~= 0 then save(KEYS[4], level(KEYS[4], tok_cap) - tok_adjust, tok_cap) end
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return {0, math.max(0, tonumber(first[2]) - now), 'concurrency'}
  end
end
local wait, reason = 0, false
local blocked = redis.call('PTTL', KEYS[5])
if blocked > 0 then wait, reason = blocked, 'blocked' end
local req_level, tok_level
if req_cap > 0 then
  req_level = level(KEYS[3], req_cap)
  local w = (1 - req_level) * per / req_cap
  if req_level < 1 and w > wait then wait, reason = w, 'requests' end
end
if tok_cap > 0 then
  tok_level = level(KEYS[4], tok_cap) - tok_adjust
  local w = (tok_cost - tok_level) * per / tok_cap
  if tok_level < tok_cost and w > wait then wait, reason = w, 'tokens' end
end
if reason then
  if tok_cap > 0 and tok_adjust ~= 0 then save(KEYS[4], tok_level, tok_cap) end
  return {0, math.ceil(wait), reason}
end
if req_cap > 0 then save(KEYS[3], req_level - 1, req_cap) end
if tok_cap > 0 then save(KEYS[4], tok_level - tok_cost, tok_cap) end
if limit > 0 and not holds then take(KEYS[1], KEYS[2], run, key, slot_ms, KEYS[6], KEYS[7], KEYS[8]) end
return {1, 0, ''}
"""
)

#: KEYS: slots, run map, waiting, steps, index. ARGV: run_id, key, limit, slot_ms, priority, step.
WAIT_FOR_ROOM = (
    _NOW
    + _TAKE
    + """
local run, key, limit, slot_ms = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], run) then return 1 end
if redis.call('ZCARD', KEYS[1]) < limit then
  take(KEYS[1], KEYS[2], run, key, slot_ms, KEYS[3], KEYS[4], KEYS[5])
  return 1
end
redis.call('ZADD', KEYS[3], 'NX', (9 - tonumber(ARGV[5])) * 1e13 + now, run)
redis.call('HSET', KEYS[4], run, ARGV[6])
redis.call('PEXPIRE', KEYS[3], slot_ms)
redis.call('PEXPIRE', KEYS[4], slot_ms)
redis.call('SET', KEYS[2], key, 'PX', slot_ms)
return 0
"""
)

#: KEYS: run map. ARGV: run_id, limit, slot_ms, prefix. The key's own keys are named from the
#: map's value (so no Redis Cluster; Celery's Redis transport needs none either).
RELEASE = (
    _NOW
    + _TAKE
    + _WAKE
    + """
local run, limit, slot_ms, prefix = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local key = redis.call('GET', KEYS[1])
if not key then return false end
redis.call('DEL', KEYS[1])
local slots, waiting, steps = prefix .. 'slots:' .. key, prefix .. 'waiting:' .. key, prefix .. 'steps:' .. key
redis.call('ZREM', slots, run)
redis.call('ZREM', waiting, run)
redis.call('HDEL', steps, run)
return wake(slots, waiting, steps, key, limit, slot_ms, prefix)
"""
)

#: KEYS: slots, run map, waiting, steps. ARGV: run_id, key, limit, slot_ms, prefix, until.
#: A release for the sweeper: only a place still stamped `until` (not renewed since it was
#: listed) is freed. Returns {1, the woken step or ''} when freed, {0, ''} when not.
FREE = (
    _NOW
    + _TAKE
    + _WAKE
    + """
local run, key, limit, slot_ms, prefix = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local stamp = redis.call('ZSCORE', KEYS[1], run)
if not stamp or tonumber(stamp) ~= tonumber(ARGV[6]) then return {0, ''} end
if redis.call('GET', KEYS[2]) == key then redis.call('DEL', KEYS[2]) end
redis.call('ZREM', KEYS[1], run)
redis.call('ZREM', KEYS[3], run)
redis.call('HDEL', KEYS[4], run)
return {1, wake(KEYS[1], KEYS[3], KEYS[4], key, limit, slot_ms, prefix) or ''}
"""
)

#: KEYS: index. ARGV: prefix, then keys whose places were found gone: each leaves the index
#: unless a place was taken in it meanwhile.
FORGET = """
for i = 2, #ARGV do
  if redis.call('EXISTS', ARGV[1] .. 'slots:' .. ARGV[i]) == 0 then redis.call('SREM', KEYS[1], ARGV[i]) end
end
"""

#: KEYS: blocked. ARGV: ms. A later 429 may lengthen the block, never shorten it.
BLOCK = """
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], 1, 'PX', ARGV[1]) end
"""


class RedisLimiter:
    """A `Limiter` on Redis at `url` (RATCHET_LIMITER_URL, which is RATCHET_REDIS_URL by default)."""

    def __init__(self, settings: Settings, url: str, *, prefix: str = PREFIX) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=LIMITER_TIMEOUT, socket_connect_timeout=LIMITER_TIMEOUT)
        self.prefix = prefix
        self.slot_ms = max(1, round(settings.run_slot_seconds * 1000))
        self._admit = self.client.register_script(ADMIT)
        self._wait = self.client.register_script(WAIT_FOR_ROOM)
        self._release = self.client.register_script(RELEASE)
        self._free = self.client.register_script(FREE)
        self._forget = self.client.register_script(FORGET)
        self._block = self.client.register_script(BLOCK)
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}  # model -> tokens to settle at its next admit
        self._warned = 0.0
        #: Until when (monotonic) a failed Redis is not asked again: each step goes on as if it
        #: had failed, at once, instead of waiting out LIMITER_TIMEOUT on a Redis that hangs.
        self._down_until = 0.0

    @property
    def index(self) -> str:
        """The set of the keys with places taken (no key's own: a key's name follows a colon)."""
        return f"{self.prefix}keys"

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}{kind}:{name}"

    def admit(self, ask: Ask) -> Verdict:
        key = ask.key if ask.key is not None and ask.limit else ""
        model = ask.model or ""
        rate = ask.rate or RateLimit()
        with self._lock:  # sent with this call; kept again below if it does not reach Redis
            adjust = self._pending.pop(model, 0) if model and rate.tokens else 0
        keys = [
            self._key("slots", key),
            self._key("run", ask.run_id),
            self._key("requests", model),
            self._key("tokens", model),
            self._key("blocked", model),
            self._key("waiting", key),
            self._key("steps", key),
            self.index,
        ]
        args: list[str | int] = [
            ask.run_id,
            key,
            ask.limit if key else 0,
            self.slot_ms,
            rate.requests or 0,
            rate.tokens or 0,
            max(1, round(rate.per * 1000)),
            ask.tokens,
            adjust,
        ]
        if self._down():
            self._keep(model, adjust)
            return Verdict()
        try:
            admitted, wait_ms, reason = self._admit(keys=keys, args=args)
        except (redis.RedisError, OSError) as exc:
            self._keep(model, adjust)
            self._failed(f"run {ask.run_id} goes on unthrottled", exc)
            return Verdict()
        if admitted:
            return Verdict()
        return Verdict(wait=int(wait_ms) / 1000, reason=_text(reason))

    def wait_for_room(self, key: str, limit: int, step: StepRef) -> bool:
        body = json.dumps(
            {
                "run_id": step.run_id,
                "seq": step.seq,
                "kind": step.kind,
                "queue": step.queue,
                "priority": step.priority,
                "routed": step.routed,
                "trace_context": step.trace_context,  # published under the run's stored parent
            }
        )
        keys = [
            self._key("slots", key),
            self._key("run", step.run_id),
            self._key("waiting", key),
            self._key("steps", key),
            self.index,
        ]
        if self._down():
            return True
        try:
            return bool(self._wait(keys=keys, args=[step.run_id, key, limit, self.slot_ms, step.priority or 0, body]))
        except (redis.RedisError, OSError) as exc:
            self._failed(f"run {step.run_id} is published now", exc)
            return True

    def release(self, run_id: str, limit: int) -> StepRef | None:
        if self._down():
            return None
        try:
            body = self._release(keys=[self._key("run", run_id)], args=[run_id, limit, self.slot_ms, self.prefix])
        except (redis.RedisError, OSError) as exc:
            self._failed(f"the sweeper frees the place of run {run_id} once Redis answers", exc)
            return None
        return None if body is None else _step(json.loads(body))

    def held(self) -> list[Place]:
        """The places of every key in the index, read a batch of keys a round trip; keys found
        without places leave it."""
        if self._down():
            return []
        places: list[Place] = []
        try:
            batch: list[str] = []
            for name in self.client.sscan_iter(self.index, count=HELD_BATCH):
                batch.append(_text(name))
                if len(batch) == HELD_BATCH:
                    places += self._places(batch)
                    batch = []
            if batch:
                places += self._places(batch)
        except (redis.RedisError, OSError) as exc:
            self._failed("the places of runs that ended are not freed by this sweep", exc)
            return []
        return places

    def _places(self, keys: list[str]) -> list[Place]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.zrange(self._key("slots", key), 0, -1, withscores=True)
        found = pipe.execute()
        gone = [key for key, members in zip(keys, found, strict=True) if not members]
        if gone:
            self._forget(keys=[self.index], args=[self.prefix, *gone])
        return [
            Place(key=key, run_id=_text(run_id), until=float(until))
            for key, members in zip(keys, found, strict=True)
            for run_id, until in members
        ]

    def free(self, place: Place, limit: int) -> tuple[bool, StepRef | None]:
        keys = [
            self._key("slots", place.key),
            self._key("run", place.run_id),
            self._key("waiting", place.key),
            self._key("steps", place.key),
        ]
        if self._down():
            return False, None
        try:
            freed, body = self._free(
                keys=keys, args=[place.run_id, place.key, limit, self.slot_ms, self.prefix, repr(place.until)]
            )
        except (redis.RedisError, OSError) as exc:
            self._failed(f"the place of run {place.run_id} is left to the next sweep", exc)
            return False, None
        return bool(freed), _step(json.loads(body)) if body else None

    def settle(self, model: str, rate: RateLimit, tokens: int) -> None:
        if rate.tokens is not None and tokens:
            self._keep(model, tokens)

    def _keep(self, model: str, tokens: int) -> None:
        """Add `tokens` to the model's correction, sent with its next `admit` that reaches Redis."""
        if tokens:
            with self._lock:
                self._pending[model] = self._pending.get(model, 0) + tokens

    def block(self, model: str, seconds: float) -> None:
        if self._down():
            return
        try:
            self._block(keys=[self._key("blocked", model)], args=[max(1, round(seconds * 1000))])
        except (redis.RedisError, OSError) as exc:
            self._failed(f"model {model} is not blocked for the other workers", exc)

    def _down(self) -> bool:
        return time.monotonic() < self._down_until

    def _failed(self, what: str, exc: BaseException) -> None:
        now = time.monotonic()
        self._down_until = now + LOG_EVERY
        if now - self._warned >= LOG_EVERY:
            self._warned = now
            log.warning("limiter: Redis failed (%s: %s); %s (it fails open)", type(exc).__name__, exc, what)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _step(fields: dict[str, Any]) -> StepRef:
    kind: StepKind = "tools" if fields["kind"] == "tools" else "model"
    return StepRef(
        run_id=str(fields["run_id"]),
        seq=int(fields["seq"]),
        kind=kind,
        queue=fields.get("queue"),
        priority=fields.get("priority"),
        routed=bool(fields.get("routed", True)),
        trace_context=fields.get("trace_context"),  # absent from a step parked before it was kept
    )
