"""A worker's memory of the transcripts it has stepped, so a claim reads only the rows it has not seen.

Messages are append-only: a committed row at `(run_id, idx)` never changes. So a cached prefix
of a run's committed messages stays true forever, and a claim needs only the rows from the end
of that prefix to the run's `n_messages` (usually none: this worker committed the last step).
Only messages known to be committed go in. Bounded by a total message count, least recently
used runs first out; a finished run is dropped.

With the messages it keeps what every model step asks of them (the tool-call ids used so far,
the tool batches since the user last spoke), updated as messages are appended, so a step at
message 2,000 does not scan 2,000 messages to answer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.messages import Message

MAX_MESSAGES = 50_000


@dataclass
class Transcript:
    """A run's committed messages in order, with facts about them kept current by `append`."""

    messages: list[Message] = field(default_factory=list)
    #: Every tool-call id the run's assistant messages used.
    call_ids: set[str] = field(default_factory=set)
    #: Assistant messages with tool calls since the user last spoke (the per-request batch cap).
    tool_batches: int = 0

    @classmethod
    def of(cls, items: Sequence[Message]) -> Transcript:
        transcript = cls()
        transcript.append(items)
        return transcript

    def append(self, items: Sequence[Message]) -> None:
        for m in items:
            if m.role == "user":
                self.tool_batches = 0
            elif m.role == "assistant" and m.tool_calls:
                self.tool_batches += 1
                # From the stored dicts: a ToolCall per earlier call made long runs slow.
                self.call_ids.update(c.get("id") or "" for c in m.tool_calls)
        self.messages.extend(items)

    def copy(self) -> Transcript:
        return Transcript(list(self.messages), set(self.call_ids), self.tool_batches)

    def __len__(self) -> int:
        return len(self.messages)


class TranscriptCache:
    """Committed message prefixes per run id. Thread-safe."""

    def __init__(self, max_messages: int = MAX_MESSAGES) -> None:
        self.max_messages = max_messages
        self._runs: OrderedDict[str, Transcript] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()

    def known(self, run_id: str) -> Transcript:
        """The run's cached committed messages (a copy; empty if none)."""
        with self._lock:
            found = self._runs.get(run_id)
            if found is None:
                return Transcript()
            self._runs.move_to_end(run_id)
            return found.copy()

    def extend(self, run_id: str, start: int, items: Sequence[Message]) -> None:
        """Record committed messages `items` stored from index `start`. Ignored unless they
        continue the cached prefix exactly (a gap or an overlap is not guessed at)."""
        with self._lock:
            found = self._runs.get(run_id)
            if found is None:
                if start != 0:
                    return
                found = self._runs[run_id] = Transcript()
            if len(found) != start:
                return
            found.append(items)
            self._total += len(items)
            self._runs.move_to_end(run_id)
            while self._total > self.max_messages and len(self._runs) > 1:
                _, evicted = self._runs.popitem(last=False)
                self._total -= len(evicted)

    def forget(self, run_id: str) -> None:
        """Drop the run (it finished, or its cached prefix disagrees with the store)."""
        with self._lock:
            found = self._runs.pop(run_id, None)
            if found is not None:
                self._total -= len(found)

    def __len__(self) -> int:
        with self._lock:
            return len(self._runs)
