"""A run's definition across a deploy, in the store (`Store.definitions`): a claimed run taken
over by the claiming worker's definition (`adopt`), and a claimed step handed back to the queue
for a worker of the run's own (`hand_on`). `orchestrator.deploys` decides which; both are
fenced by the claim (its epoch, its live lease and its owner) and logged in the run's log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import update

from orchestrator.errors import FencedError
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus
from orchestrator.store import writes
from orchestrator.store.claims import Claim, held
from orchestrator.store.tables import runs

if TYPE_CHECKING:
    from orchestrator.store.store import Store

S = RunStatus


class RunDefinitions:
    """A claimed run's definition: adopted by its worker, or its step handed on."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def adopt(self, claim: Claim, definition_hash: str, **why: Any) -> None:
        """The claimed run goes on under `definition_hash` (its worker's) from this step on: set
        as its definition, the definition a continue accepted cleared, and "definition" logged
        with the one it had (`from`), the new one (`to`) and `why`. Not a move: the run stays
        RUNNING under the claim. FencedError if the claim was lost."""
        store, record = self._store, claim.record
        now = store.clock()
        guard = (runs.c.run_id == claim.run_id, runs.c.epoch == claim.epoch, held(claim, now))
        with store.engine.begin() as conn:
            changed = conn.execute(
                update(runs).where(*guard).values(definition_hash=definition_hash, accepted_definition=None)
            ).rowcount
            if not changed:
                raise FencedError(f"run {claim.run_id}: lease of epoch {claim.epoch} lost before it took a definition")
            store.log_event(
                conn,
                claim.run_id,
                "definition",
                record.seq,
                **{"from": record.definition_hash, "to": definition_hash},
                **why,
                **writes.position(record),
            )

    def hand_on(self, claim: Claim, *, to: str, publish_grace: float) -> RunRecord:
        """Put the claimed step back in the queue, not run, for a worker of the run's own
        definition (`to`, its hash), which the caller publishes it to: the claim undone (it does
        not count toward the poison limit, the seq kept) and "handed_on" logged. Its outbox
        marker is `publish_grace` away: if no worker of that definition claims it by then (the
        last one stopped), the sweeper publishes it again. FencedError if the claim was lost."""
        store = self._store
        now = store.clock()
        with store.engine.begin() as conn:
            record = store.move(
                claim.run_id,
                src=(S.RUNNING,),
                dst=S.QUEUED,
                epoch=claim.epoch,
                extra_where=held(claim, now),
                publish_grace=publish_grace,
                conn=conn,
                lease_owner=None,
                lease_expires_at=None,
                attempts=runs.c.attempts - 1,
            )
            if record is None:
                raise FencedError(
                    f"run {claim.run_id}: lease of epoch {claim.epoch} lost before its step was handed on"
                )
            store.log_event(
                conn, claim.run_id, "handed_on", record.seq, to=to, by=claim.definition_hash, **writes.position(record)
            )
            return record
