"""Session state: one JSON object per session that tools read and change (Agno's `session_state`).

How a state moves, and why it is never changed twice:

- **Start.** An agent's `session_state=` gives the keys a session starts with: each run's first
  step adds those the stored state lacks. A run's own `session_state=` (every producer can pass
  one) is merged over the stored state, key by key, in the transaction that writes the run, so
  the run's values win: defaults < stored < the run's.
- **A tool call** sees the stored state as it is when the call first touches it
  (`ToolContext.session_state`, or a parameter named `session_state`) and changes that dict in
  place. After the call, what it changed is taken as top-level keys set and removed
  (`StateChange`), and applied to the stored state in the transaction that stores the call's
  result: keys it left alone keep what others wrote meanwhile. A call whose result is stored is
  never run again, so its change is applied once; a call whose result was not stored (its worker
  died) changed nothing, and runs again. A call that raised changes nothing.
- **One batch.** The calls of a batch that touch the state take turns (`CallState`): each reads
  the state after the change of the one before was committed with its result, so two calls
  appending to one list both land. Calls that do not touch it run concurrently as ever. An async
  tool that reads `ctx.session_state` inside its coroutine does not wait for a turn (all async
  calls of a process share one event loop, which a wait would block): if another call has the
  turn, it merges key by key like calls of different runs. An async tool that takes a
  `session_state` parameter gets it before its coroutine starts, in its turn.
- **Other runs of the session** (a team's members, two runs started at once) are not taken in
  turns: their changes merge key by key, and of two changes of one key the later commit wins.
- **Failures.** A result that the failure handler flushes onto an ERROR row carries its call's
  change too: that call will not run again. A call cut off before its result was stored (a
  killed worker, the hard time limit) changed nothing; an ordinary tool runs again on the redo,
  an at-most-once tool does not (its outcome is unknown, and the state shows no change for it).

The state is a JSON object of at most `STATE_MAX_BYTES`; what a tool leaves in it must be JSON
too (a tool that stores a set or a datetime gets a tool error saying so, and changes nothing).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: The largest session state, in bytes of its JSON (ASCII): it is read whole by every call that
#: uses it and by every read of a run; large documents belong in a store a tool reads.
STATE_MAX_BYTES = 1 << 20


class StateError(ValueError):
    """A state that cannot be stored: not a JSON object, or too large. The message says why."""


def to_json(state: object, what: str = "session_state", *, limit: int | None = STATE_MAX_BYTES) -> str:
    """The state as stored: a JSON object (ASCII) of at most `limit` bytes, or StateError saying
    what is wrong with it."""
    if not isinstance(state, Mapping):
        raise StateError(f"{what} must be a dict (a JSON object), not {type(state).__name__}")
    bad = next((k for k in state if not isinstance(k, str)), None)
    if bad is not None:
        raise StateError(f"{what} keys must be strings; {bad!r} is a {type(bad).__name__}")
    try:
        text = json.dumps(state, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise StateError(f"{what} must hold JSON values only (str, number, bool, None, list, dict): {exc}") from None
    if limit is not None and len(text) > limit:
        raise StateError(
            f"{what} is {len(text)} bytes as JSON; the limit is {limit} bytes: keep large data "
            "elsewhere and put its id in the state"
        )
    return text


def from_json(text: str | None) -> dict[str, Any]:
    """A stored state (NULL: none yet, an empty dict)."""
    if not text:
        return {}
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


def normalised(state: object, what: str = "session_state") -> dict[str, Any]:
    """The state as it reads back once stored (tuples become lists), or StateError."""
    value: dict[str, Any] = json.loads(to_json(state, what))
    return value


@dataclass(frozen=True, kw_only=True)
class StateChange:
    """What one tool call (or one run's start) changed: top-level keys set, and keys removed."""

    set: dict[str, Any]
    removed: tuple[str, ...] = ()

    @classmethod
    def between(cls, before: Mapping[str, Any], after: Mapping[str, Any]) -> StateChange | None:
        """The change from `before` to `after` (both JSON values), None if there is none. A key
        whose value changed anywhere inside is set whole."""
        changed = {k: v for k, v in after.items() if k not in before or before[k] != v}
        removed = tuple(k for k in before if k not in after)
        return cls(set=changed, removed=removed) if changed or removed else None

    def applied_to(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """`state` with this change applied."""
        result = {k: v for k, v in state.items() if k not in self.removed}
        result.update(self.set)
        return result


def apply(state: Mapping[str, Any], changes: Iterable[StateChange]) -> dict[str, Any]:
    """`state` with `changes` applied in order."""
    result = dict(state)
    for change in changes:
        result = change.applied_to(result)
    return result


def with_defaults(state: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """`state` with the keys of `defaults` it lacks (an agent's `session_state=`)."""
    return {**defaults, **state}


class Turn:
    """Whose turn it is to use the state among the calls of one tool batch. Once the batch is
    ending (`end`), nobody waits for a turn any more: a failing step must not wait on a call
    that waits for a result the step will no longer commit."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._ending = False

    def take(self, *, wait: bool = True) -> bool:
        """Wait for the turn; False (without it) once the batch is ending, or at once if another
        call has it and `wait` is False."""
        with self._cond:
            if wait:
                self._cond.wait_for(lambda: not self._busy or self._ending)
            if self._ending or self._busy:
                return False
            self._busy = True
            return True

    def give(self) -> None:
        """Hand the turn on."""
        with self._cond:
            self._busy = False
            self._cond.notify_all()

    def end(self) -> None:
        """The batch is ending: wake every waiter, and let none wait from now on."""
        with self._cond:
            self._ending = True
            self._cond.notify_all()


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class CallState:
    """One tool call's view of its session's state: read when the call first touches it, in its
    batch's turn (`Turn`), and compared with what the call left when it returns.

    The turn is kept until the call's change is committed with its result (`release`), so the
    next call of the batch reads the state with that change in it."""

    def __init__(self, load: Callable[[], dict[str, Any]], turn: Turn | None = None) -> None:
        self._load = load
        self._turn = turn
        self._held = False
        self._before: dict[str, Any] | None = None
        self._state: dict[str, Any] | None = None

    @property
    def opened(self) -> bool:
        """Whether the call touched the state."""
        return self._state is not None

    def open(self) -> dict[str, Any]:
        """The state for the call to read and change in place (read once per call, in its thread)."""
        if self._state is None:
            if self._turn is not None:
                # On the tool loop (an async tool's `ctx.session_state`), a wait would block every
                # async call of the process, the turn's holder among them: it goes without one.
                self._held = self._turn.take(wait=not _on_event_loop())
            self._before = self._load()
            self._state = json.loads(json.dumps(self._before))  # the call's own copy
        return self._state

    def change(self) -> StateChange | None:
        """What the call changed, None if nothing; StateError if it left something that is not
        JSON or too large."""
        if self._state is None or self._before is None:
            return None
        return StateChange.between(self._before, normalised(self._state, "the session_state a tool left"))

    def release(self) -> None:
        """Hand the batch's turn on, if this call has it (idempotent)."""
        if self._held and self._turn is not None:
            self._held = False
            self._turn.give()
