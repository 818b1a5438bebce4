"""The two statements every step runs, built once: the claim and the commit's move.

Building a SQLAlchemy statement costs more than running it on SQLite (a fifth of a worker's
CPU per step in our profiles), so the per-step hot path uses these prebuilt statements with
bound parameters. They encode exactly the guarded moves `Store._move` would build; the moves
they make are checked against `status.TRANSITIONS` here, once, at import.
"""

from __future__ import annotations

from sqlalchemy import Float, Integer, String, Text, and_, bindparam, func, or_, update

from orchestrator.status import RunStatus, can_move
from orchestrator.store.schema import runs

S = RunStatus
NO_CAP = 2**31 - 1

for _src, _dst in ((S.QUEUED, S.RUNNING), (S.RUNNING, S.RUNNING)):
    assert can_move(_src, _dst), f"the claim's move {_src} -> {_dst} is not in the transition table"

#: Take the run for step (seq, kind): QUEUED, or RUNNING with an expired lease; bump the epoch.
CLAIM = (
    update(runs)
    .where(
        runs.c.run_id == bindparam("b_run_id", type_=String),
        or_(
            runs.c.status == S.QUEUED.value,
            and_(runs.c.status == S.RUNNING.value, runs.c.lease_expires_at < bindparam("b_now", type_=Float)),
        ),
        runs.c.seq == bindparam("b_seq", type_=Integer),
        runs.c.next_step == bindparam("b_kind", type_=String),
        runs.c.attempts < bindparam("b_cap", type_=Integer),
    )
    .values(
        status=S.RUNNING.value,
        updated_at=bindparam("b_now", type_=Float),
        epoch=runs.c.epoch + 1,
        lease_owner=bindparam("b_owner", type_=String),
        lease_expires_at=bindparam("b_expires", type_=Float),
        attempts=runs.c.attempts + 1,
    )
    .returning(*runs.c)
)

#: Move a RUNNING run on at the holder's epoch while its lease is live: next seq, messages
#: counted, lease released. `content` and `system_message` are kept when the bound value is NULL
#: (a system message already stored always wins).
COMMIT = (
    update(runs)
    .where(
        runs.c.run_id == bindparam("b_run_id", type_=String),
        runs.c.status == S.RUNNING.value,
        runs.c.epoch == bindparam("b_epoch", type_=Integer),
        runs.c.lease_owner == bindparam("b_owner", type_=String),
        runs.c.lease_expires_at > bindparam("b_now", type_=Float),
    )
    .values(
        status=bindparam("b_status", type_=String),
        updated_at=bindparam("b_now", type_=Float),
        seq=runs.c.seq + 1,
        next_step=bindparam("b_next", type_=String),
        n_messages=runs.c.n_messages + bindparam("b_count", type_=Integer),
        attempts=0,
        retries=0,
        lease_owner=None,
        lease_expires_at=None,
        publish_after=bindparam("b_publish_after", type_=Float),
        content=func.coalesce(bindparam("b_content", type_=Text), runs.c.content),
        system_message=func.coalesce(runs.c.system_message, bindparam("b_system", type_=Text)),
    )
    .returning(*runs.c)
)
