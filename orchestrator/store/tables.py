"""The run store's tables (SQLAlchemy Core). Migrations in `migrations/` create exactly these.

Times are UNIX seconds (float): the same on SQLite and PostgreSQL, and cheap to compare.
Hosts that run workers keep their clocks in sync (NTP), since leases compare them.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    Text,
    false,
    text,
)

metadata = MetaData()

sessions = Table(
    "ratchet_sessions",
    metadata,
    Column("session_id", String(128), primary_key=True),
    Column("created_at", Float, nullable=False),
    # Who the session belongs to, as the producer of its first run said (migration 0006).
    Column("user_id", String(128), nullable=True),
    # The session's state, a JSON object tools read and change (`ToolContext.session_state`).
    Column("session_state", Text, nullable=True),
)

runs = Table(
    "ratchet_runs",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("session_id", String(128), ForeignKey("ratchet_sessions.session_id"), nullable=False),
    Column("agent_name", String(256), nullable=False),
    Column("kind", String(16), nullable=False),  # "agent" | "team"
    Column("parent_run_id", String(64), nullable=True),
    # The team's delegation call that started this member run (migration 0002).
    Column("parent_tool_call_id", String(128), nullable=True),
    Column("forked_from", String(64), nullable=True),
    Column("status", String(16), nullable=False),
    # Fencing token: bumped by every claim, re-claim, continue and cancel. A write that names an
    # older epoch changes nothing.
    Column("epoch", Integer, nullable=False, default=0),
    # The step counter. A task carries (run_id, seq); a delivery for another seq is stale.
    Column("seq", Integer, nullable=False, default=0),
    # What the next step is: "model", "tools", or NULL once final.
    Column("next_step", String(16), nullable=True),
    Column("n_messages", Integer, nullable=False, default=0),
    Column("system_message", Text, nullable=True),
    Column("lease_owner", String(255), nullable=True),
    Column("lease_expires_at", Float, nullable=True),
    # Claims of the current step; the sweeper errors a run out after RATCHET_MAX_STEP_ATTEMPTS.
    Column("attempts", Integer, nullable=False, default=0),
    # Transient model failures retried in the current step (the agent's `retries` caps it).
    Column("retries", Integer, nullable=False, default=0),
    # The outbox marker: when a QUEUED run's step should be (re)published by the sweeper if no
    # worker has claimed it by then. Covers a crash between commit and publish, a lost message,
    # and retries parked longer than a countdown may safely wait.
    Column("publish_after", Float, nullable=True),
    Column("content", Text, nullable=True),
    Column("error_type", String(128), nullable=True),
    Column("error_message", Text, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    # Started with stream=True: its steps publish live events (deltas) too (migration 0004).
    Column("stream", Boolean, nullable=False, default=False, server_default=false()),
    # Who the run is for, as its producer said (migration 0006).
    Column("user_id", String(128), nullable=True),
    # Which earlier runs of the session its context includes, JSON [[run_id, n_messages], ...],
    # fixed at its first claim (`orchestrator.history`); NULL until then or without history.
    Column("history", Text, nullable=True),
    # The priority its producer gave it, 0-9, higher first; NULL: none given, the lowest, as 0
    # (migration 0008). Every step of the run is published with it.
    Column("priority", SmallInteger, nullable=True),
    # The W3C traceparent of the span its producer started it under (`orchestrator.tracing`,
    # migration 0009); NULL when it traced nothing: its steps' trace is derived from the run id.
    Column("trace_context", Text, nullable=True),
    # SHA-256 (hex) of the input and session_state its start asked for, so that a start sent
    # again under its run_id with another request is refused (`orchestrator.idempotency`,
    # migration 0012); NULL for a run no start wrote (a fork, a member run) or written before.
    Column("request_digest", String(64), nullable=True),
    # The definition hash of its agent when it started (`orchestrator.catalog`, migration 0013):
    # from the producer's own definition, else the catalog's live one; NULL when neither was
    # there (a producer without the agent and no worker serving it yet) or written before. A
    # worker of another definition that takes the run over across a deploy writes its own
    # (`orchestrator.deploys`, `store/definitions.py`).
    Column("definition_hash", String(64), nullable=True),
    # The place in its agent's fallback chain of the model its current model step calls
    # (`orchestrator.models.fallback`, migration 0017); NULL: 0, the agent's own model. Written
    # by a fallback before it calls the next model; a commit and a continue clear it.
    Column("model_index", SmallInteger, nullable=True),
    # When the step last claimed was queued (migration 0018): the claim sets it from `updated_at`
    # as it was (the move to QUEUED) before the claim overwrites it; NULL on a claim of a RUNNING
    # run whose lease expired. Its commit stamps it on its messages (`step_queued_at`).
    Column("queued_at", Float, nullable=True),
    # The URL its producer asked to be told at, each time the run stops (`orchestrator.webhooks`,
    # migration 0021); NULL: none. Each move to a final status writes a `ratchet_webhook_deliveries`
    # row in the same transaction.
    Column("webhook", Text, nullable=True),
    # Its deadline (UNIX seconds): when it passes before the run ends, the sweeper stops the run
    # in ERROR with RunTimeoutError, its tree with it (`orchestrator.deadlines`), and no step
    # of it is claimed after it; `run_timeout`, the seconds it was given (from its start, or
    # the continue that gave it), which a continue after the deadline gives it again. NULL: none
    # (migration 0023). A team's member runs have none of their own: their team's covers them.
    Column("deadline_at", Float, nullable=True),
    Column("run_timeout", Float, nullable=True),
    # A run of its session waits behind this one (`serialize_session_runs`, `store/turns.py`,
    # migration 0024): when it stops, whoever stopped it, or else the sweeper, gives the first run
    # waiting its turn, and clears this. NULL: none waits (what every other run holds).
    Column("wakes_session", Boolean, nullable=True),
    # A definition a continue accepted for the run although it changed what the run's next step
    # depends on (`orchestrator.deploys`, migration 0025): a worker serving it takes the run over at
    # its next claim (setting `definition_hash` to it) and clears it. NULL: none.
    Column("accepted_definition", String(64), nullable=True),
    # PostgreSQL: pages keep a fifth free for the rows' updates, so that one which changes no
    # indexed column (a lease renewed) is done in place, with no index entry (migration 0015).
    postgresql_with={"fillfactor": 80},
)
Index("ix_ratchet_runs_session", runs.c.session_id, runs.c.created_at)
# Only runs with a user, and member runs: a step of another run writes no entry in them (an update
# PostgreSQL cannot do in place writes one in each index whose condition the row meets; 0015).
_HAS_USER, _HAS_PARENT = text("user_id IS NOT NULL"), text("parent_run_id IS NOT NULL")
Index("ix_ratchet_runs_user", runs.c.user_id, runs.c.created_at, postgresql_where=_HAS_USER, sqlite_where=_HAS_USER)
Index("ix_ratchet_runs_parent", runs.c.parent_run_id, postgresql_where=_HAS_PARENT, sqlite_where=_HAS_PARENT)
Index("ix_ratchet_runs_sweep", runs.c.status, runs.c.publish_after)
# The sweeper's deadline pass reads the runs going past theirs, by status (migration 0023): only
# runs with a deadline have an entry, and one that ended is under a status the pass does not read.
_HAS_DEADLINE = text("deadline_at IS NOT NULL")
Index(
    "ix_ratchet_runs_deadline",
    runs.c.status,
    runs.c.deadline_at,
    postgresql_where=_HAS_DEADLINE,
    sqlite_where=_HAS_DEADLINE,
)
# The runs a run of their session waits behind (migration 0024): few, and the sweeper reads those
# that stopped; no other run has an entry.
_WAKES_PG, _WAKES_SQLITE = text("wakes_session"), text("wakes_session = 1")
Index("ix_ratchet_runs_wakes", runs.c.session_id, postgresql_where=_WAKES_PG, sqlite_where=_WAKES_SQLITE)
# Metrics read the runs started since they last looked (`store/metrics.py`; migration 0018).
Index("ix_ratchet_runs_created", runs.c.created_at)
# Listing runs newest first by status, and by agent and status (migration 0007, `listing.py`):
# without QUEUED and RUNNING runs, so that a step, which moves its run between those two, writes
# no entry in them.
_SETTLED = text("status NOT IN ('QUEUED', 'RUNNING')")
Index(
    "ix_ratchet_runs_status_listing", runs.c.status, runs.c.created_at, runs.c.run_id,
    postgresql_where=_SETTLED, sqlite_where=_SETTLED,
)  # fmt: skip
Index(
    "ix_ratchet_runs_agent_listing", runs.c.agent_name, runs.c.status, runs.c.created_at, runs.c.run_id,
    postgresql_where=_SETTLED, sqlite_where=_SETTLED,
)  # fmt: skip

messages = Table(
    "ratchet_messages",
    metadata,
    Column("run_id", String(64), ForeignKey("ratchet_runs.run_id"), nullable=False),
    Column("idx", Integer, nullable=False),
    Column("role", String(16), nullable=False),
    Column("content", Text, nullable=True),
    Column("tool_calls", Text, nullable=True),
    Column("tool_call_id", String(128), nullable=True),
    Column("tool_name", String(256), nullable=True),
    Column("tool_args", Text, nullable=True),
    Column("tool_call_error", Boolean, nullable=False, default=False),
    Column("created_at", Float, nullable=False),
    # The run's step counter and fencing token under which the row was written (migration 0003;
    # NULL on older rows), so an audit can tell which attempt produced it. A step's messages (its
    # commit, each tool result, the in-flight messages its failure flushes) carry its claim's
    # seq and epoch; a write outside a step (a new run's input, a continue's message, a fan-in's
    # results) carries the seq and epoch that write left the run at.
    Column("seq", Integer, nullable=True),
    Column("epoch", Integer, nullable=True),
    # An assistant message's usage as the provider reported it, and its cost at the model's
    # prices when it was made (migration 0005; NULL when unknown: not reported, no prices, or a
    # row older than the migration). See `orchestrator.usage`.
    Column("input_tokens", Integer, nullable=True),
    Column("output_tokens", Integer, nullable=True),
    Column("cache_read_tokens", Integer, nullable=True),
    # Input tokens written to the prompt cache (Anthropic's cache creation; migration 0019).
    Column("cache_write_tokens", Integer, nullable=True),
    Column("reasoning_tokens", Integer, nullable=True),
    Column("cost", Float, nullable=True),
    # When the step whose commit wrote the row was claimed (migration 0010): set on the messages
    # a step's own commit carries (a model step's reply, a tool step's last result), NULL on
    # every other row. Its commit's `created_at` minus this is how long the step took.
    Column("step_started_at", Float, nullable=True),
    # The model that wrote an assistant message, by its configured id (migration 0017; NULL on
    # other roles and older rows): a fallback's reply names it; the metrics' model label.
    Column("model", String(256), nullable=True),
    # When that step was queued (migration 0018; the run's `queued_at` at its claim), on the same
    # rows: its claim's time minus this is how long it waited in the queue.
    Column("step_queued_at", Float, nullable=True),
    # Seconds the call took: on a reply the model call, on a tool result the tool call (of a tool
    # the agent has); and on a streamed reply, seconds to its first text (migration 0018).
    Column("duration", Float, nullable=True),
    Column("time_to_first_token", Float, nullable=True),
    # The definition hash of the worker whose step wrote the row (migration 0025): the version of
    # the agent that ran that step, beside the run's own `definition_hash`. NULL on rows no step
    # wrote (a run's input, a continue's message, a fan-in's results) and on older rows.
    Column("definition_hash", String(64), nullable=True),
    PrimaryKeyConstraint("run_id", "idx", name="pk_ratchet_messages"),
)
# Metrics read the rows written since they last looked (`store/metrics.py`; migration 0010).
Index("ix_ratchet_messages_created", messages.c.created_at)
# A tool call has at most one result: a second append of the same result fails loudly.
Index("ux_ratchet_messages_tool_result", messages.c.run_id, messages.c.tool_call_id, unique=True)

# Calls of at-most-once tools that started. A row without a result message on resume means the
# call may have taken effect: it is not run again.
tool_starts = Table(
    "ratchet_tool_starts",
    metadata,
    Column("run_id", String(64), ForeignKey("ratchet_runs.run_id"), nullable=False),
    Column("tool_call_id", String(128), nullable=False),
    Column("tool_name", String(256), nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("started_at", Float, nullable=False),
    PrimaryKeyConstraint("run_id", "tool_call_id", name="pk_ratchet_tool_starts"),
)

# What happened to a run besides its messages: errors, retries, continues, fences, sweeps.
events = Table(
    "ratchet_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), nullable=False),
    Column("at", Float, nullable=False),
    Column("kind", String(64), nullable=False),
    Column("seq", Integer, nullable=True),
    Column("detail", Text, nullable=True),
)
Index("ix_ratchet_events_run", events.c.run_id, events.c.id)
Index("ix_ratchet_events_at", events.c.at)  # metrics, as above (migration 0010)

# Live events of streamed runs where the broker is not Redis (migration 0004): one row per delta
# or step restart, `body` the event's JSON; written on the lazy engine, deleted once old.
deltas = Table(
    "ratchet_deltas",
    metadata,
    # One row per token: 64 bits on PostgreSQL (a 32-bit serial runs out within weeks at a
    # thousand tokens a second); SQLite's INTEGER PRIMARY KEY is 64 bits already.
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True),
    Column("run_id", String(64), nullable=False),
    Column("event_id", String(96), nullable=False),
    Column("body", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)
Index("ix_ratchet_deltas_run", deltas.c.run_id, deltas.c.id)
Index("ix_ratchet_deltas_created", deltas.c.created_at)

# Metric counters up to a time (migration 0010, `store/metrics.py`): what the rows written up to
# `MARK`'s value added, kept here so that reading a counter sums only the rows written since,
# and so that deleting old runs (retention) never takes a counter down. One row per counter and
# label set; the row (MARK, "", "") holds the time the others count up to.
metric_totals = Table(
    "ratchet_metric_totals",
    metadata,
    Column("name", String(64), nullable=False),
    Column("agent", String(256), nullable=False),
    Column("label", String(320), nullable=False),  # 64 until migration 0018: a model id or tool name now
    Column("value", Float, nullable=False),
    PrimaryKeyConstraint("name", "agent", "label", name="pk_ratchet_metric_totals"),
)

# The agent catalog (migration 0013, `store/catalog_rows.py`): each definition workers serve, one row
# per version (name and definition hash), with when a worker first and last said it serves it.
agent_catalog = Table(
    "ratchet_agent_catalog",
    metadata,
    Column("name", String(256), nullable=False),
    Column("definition_hash", String(64), nullable=False),
    Column("kind", String(16), nullable=False),
    # The definition as canonical JSON: model, instructions digest, tools, members, schemas, queues.
    Column("definition", Text, nullable=False),
    Column("first_seen", Float, nullable=False),
    Column("last_seen", Float, nullable=False),
    PrimaryKeyConstraint("name", "definition_hash", name="pk_ratchet_agent_catalog"),
)

# Leases of jobs one process of the fleet does at a time (migration 0014, `store/leases.py`): the
# sweeper's is "sweeper". Held by `owner` until `expires_at` unless renewed; `renewed_at` is when
# its holder last took or renewed it (for the sweeper: its last pass), kept after it is let go.
leases = Table(
    "ratchet_leases",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("owner", String(256), nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("renewed_at", Float, nullable=False),
)

# What paused runs ask of a person (migration 0016, `store/paused.py`): one row per paused
# tool call (or spent budget), written in the commit that pauses its run, decided once.
requirements = Table(
    "ratchet_requirements",
    metadata,
    Column("id", String(64), primary_key=True),
    # The run whose call it is; `root_run_id` the top of its team (itself outside a team), whose
    # row every decision in that tree locks first, so that decisions and pauses take turns.
    Column("run_id", String(64), ForeignKey("ratchet_runs.run_id"), nullable=False),
    Column("root_run_id", String(64), nullable=False),
    Column("agent_name", String(256), nullable=False),
    # The run's step counter when it paused.
    Column("seq", Integer, nullable=False),
    # "confirmation" | "user_input" | "external_execution" | "budget".
    Column("pause_type", String(32), nullable=False),
    Column("tool_call_id", String(128), nullable=True),
    Column("tool_name", String(256), nullable=True),
    Column("tool_args", Text, nullable=True),
    # JSON: the user-input fields asked, or the budget spent.
    Column("detail", Text, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("deadline_at", Float, nullable=True),
    Column("on_timeout", String(16), nullable=True),
    # "pending" | "decided" | "expired" | "void".
    Column("status", String(16), nullable=False),
    Column("decision", Text, nullable=True),
    Column("decided_by", String(128), nullable=True),
    Column("decided_at", Float, nullable=True),
    # A paused call's tool as it paused (migration 0022, `orchestrator.paused_tools`): the hash of
    # the definition its worker served, and a digest of the tool (its arguments, what it asks);
    # NULL for a budget, and for rows written before. A decision is applied to that tool only.
    Column("definition_hash", String(64), nullable=True),
    Column("tool_digest", String(64), nullable=True),
)
Index("ix_ratchet_requirements_run", requirements.c.run_id, requirements.c.created_at)
Index("ix_ratchet_requirements_root", requirements.c.root_run_id, requirements.c.status)
# The deadlines the sweeper acts on: pending rows only.
_PENDING = text("status = 'pending'")
Index(
    "ix_ratchet_requirements_deadline", requirements.c.deadline_at,
    postgresql_where=_PENDING, sqlite_where=_PENDING,
)  # fmt: skip

# Schedules: an agent run on a cron schedule (migration 0020, `store/schedule_rows.py`,
# `orchestrator.schedules`). `next_at` is the next tick due (UNIX seconds); a sweeper pass
# fires the schedules whose `next_at` passed and moves it on with a guarded UPDATE.
schedules = Table(
    "ratchet_schedules",
    metadata,
    Column("schedule_id", String(40), primary_key=True),
    Column("agent_name", String(256), nullable=False),
    Column("cron", String(128), nullable=False),
    Column("timezone", String(64), nullable=False),
    Column("input", Text, nullable=False),
    Column("session_id", String(128), nullable=True),
    Column("user_id", String(128), nullable=True),
    Column("created_at", Float, nullable=False),
    Column("next_at", Float, nullable=False),
    # The last tick fired, and its run.
    Column("last_tick", Float, nullable=True),
    Column("last_run_id", String(64), nullable=True),
)
Index("ix_ratchet_schedules_next", schedules.c.next_at)

# The webhook outbox (migration 0021, `store/webhook_rows.py`): one row per stop of a run that has
# a webhook, written in the transaction of the move, delivered (and retried) by the sweeper.
webhook_deliveries = Table(
    "ratchet_webhook_deliveries",
    metadata,
    # "<run_id>.<epoch>.<status>": one stop of a run (every move out of a stop bumps the epoch or
    # the status), so a commit sent twice writes one row; the receiver de-duplicates on it.
    Column("delivery_id", String(128), primary_key=True),
    Column("run_id", String(64), nullable=False),
    Column("session_id", String(128), nullable=False),
    Column("agent_name", String(256), nullable=False),
    Column("url", Text, nullable=False),
    # The run as it stopped: what the POST's body says of it.
    Column("run_status", String(16), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("content", Text, nullable=True),
    Column("error_type", String(128), nullable=True),
    Column("error_message", Text, nullable=True),
    Column("created_at", Float, nullable=False),
    # "pending" | "delivered" | "failed" (attempts spent, a 410, or a refused address).
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", Float, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("delivered_at", Float, nullable=True),
)
Index("ix_ratchet_webhook_deliveries_run", webhook_deliveries.c.run_id)
_UNSENT = text("state = 'pending'")
Index(
    "ix_ratchet_webhook_deliveries_due", webhook_deliveries.c.next_attempt_at,
    postgresql_where=_UNSENT, sqlite_where=_UNSENT,
)  # fmt: skip
