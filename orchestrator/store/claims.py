"""A claimed step: what the claim hands the worker, and the guard every later write of it needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_

from orchestrator.messages import Message
from orchestrator.run import RunRecord
from orchestrator.store import direct, statements
from orchestrator.store.tables import runs
from orchestrator.store.transcripts import Transcript, TranscriptCache


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A claimed step: the run as the claim left it, and its stored messages."""

    record: RunRecord
    transcript: Transcript
    #: The definition hash of the run's agent as the claiming worker serves it (`orchestrator.
    #: deploys`): every message the step writes is stamped with it. None: not known to it.
    definition_hash: str | None = None

    @property
    def messages(self) -> list[Message]:
        return self.transcript.messages

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def epoch(self) -> int:
        return self.record.epoch


def held(claim: Claim, now: float) -> Any:
    """A worker's write needs its lease live and its own, not only its epoch.

    Live: once the lease expired the sweeper may be re-queueing the run at this very moment, so
    the worker is no longer its holder even before anyone took over (a live worker's heartbeat
    renews the lease, so a healthy step never gets here before its hard time limit). Its own: on
    PostgreSQL the claim commits without waiting for its WAL flush, so a database crash can lose
    a claim and a later claim can reuse its epoch number; the owner (host, pid, task id) still
    tells the two holders apart."""
    return and_(runs.c.lease_expires_at > now, runs.c.lease_owner == claim.record.lease_owner)


def transcript(
    conn: Connection,
    cache: TranscriptCache,
    record: RunRecord,
    *,
    known: Transcript | None = None,
    tail: list[Message] | None = None,
) -> Transcript:
    """The claimed run's committed messages: the prefix `cache` holds plus the rows after it.

    `known` and `tail`: a cached prefix and the rows after it, already read with the record
    (used when they add up to the record's count; else read again). Committed messages are
    never rewritten and the row counts them, so a prefix read earlier stays valid."""
    if known is not None and tail is not None and len(known) + len(tail) == record.n_messages:
        cache.extend(record.run_id, len(known), tail)
        known.append(tail)
        return known
    known = cache.known(record.run_id)
    if len(known) > record.n_messages:  # cannot happen to committed rows; trust the store
        cache.forget(record.run_id)
        known = Transcript()
    if len(known) < record.n_messages:
        rows = direct.rows(conn, statements.MESSAGES, {"b_run_id": record.run_id, "b_since": len(known)})
        tail = [Message.from_row(r) for r in rows][: record.n_messages - len(known)]
        cache.extend(record.run_id, len(known), tail)
        known.append(tail)
    return known
