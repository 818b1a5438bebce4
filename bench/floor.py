"""The floor: what a careful engineer gets from Celery and SQLAlchemy alone.

`bench.hop(run_id, n, total, io)` does one SQLAlchemy transaction (append one ~300-byte message
row, update the run row), then enqueues hop n+1 itself (not a canvas chain). Celery runs with the
durability settings any such chain needs (JSON, acks_late, reject_on_worker_lost, prefetch 1)
and nothing else: no task events, no result backend. With `io` set, even hops first make one
HTTP call to the scripted model server (which delays as configured), like a model call.
`bench.stream_hop(run_id, io, key)` is one such hop whose model call streams: each text delta
goes to the producer through a Redis stream as it arrives (`stream_call`).

Also the physical limit: a bare Redis hop (LPUSH, BRPOP) and one raw-driver transaction.

A worker runs it as `celery -A bench.floor:app worker`; the environment names the database
(BENCH_FLOOR_DB), the broker (BENCH_REDIS_URL) and the queue (BENCH_FLOOR_QUEUE).
"""

from __future__ import annotations

import http.client
import json
import os
import sqlite3
import sys
import threading
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import psycopg
import redis
from celery import Celery, Task
from sqlalchemy import (
    Column,
    Engine,
    Float,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    insert,
    select,
    update,
)
from sqlalchemy.engine import make_url

import bench.ready  # noqa: F401  (announces readiness)
from bench.env import SQLITE_SYNCHRONOUS
from orchestrator.store.database import open_engine

if TYPE_CHECKING:
    import openai

HOP_TASK = "bench.hop"
#: One hop that streams its model call and pushes each text delta to the producer (bench/streaming.py).
STREAM_HOP_TASK = "bench.stream_hop"
PAYLOAD = ("The tool returned its result; the model reads it on the next turn. " * 5)[:300]

metadata = MetaData()
floor_runs = Table(
    "bench_floor_runs", metadata,
    Column("run_id", String(64), primary_key=True),
    Column("status", String(16), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)  # fmt: skip
floor_messages = Table(
    "bench_floor_messages", metadata,
    Column("run_id", String(64), nullable=False),
    Column("idx", Integer, nullable=False),
    Column("role", String(16), nullable=False),
    Column("content", Text, nullable=True),
    Column("created_at", Float, nullable=False),
    PrimaryKeyConstraint("run_id", "idx"),
)  # fmt: skip


def floor_engine(url: str) -> Engine:
    """SQLAlchemy with the store's SQLite tuning (WAL, BEGIN IMMEDIATE), without pre-ping."""
    if url.startswith("postgres"):
        engine = open_engine(url, pool_pre_ping=False)
    else:
        engine = open_engine(url, sqlite_synchronous=SQLITE_SYNCHRONOUS)
    metadata.create_all(engine)
    return engine


def create_floor_app(broker_url: str, queue: str) -> Celery:
    """A bare Celery app with the one hop task."""
    app = Celery("bench-floor", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json", accept_content=["json"], task_ignore_result=True, result_backend=None,
        task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
        task_default_queue=queue, worker_hijack_root_logger=False, broker_connection_retry_on_startup=True,
        # kombu's Redis channel opens at most 10 connections by default, and a green pool's acks then
        # fail ("Too many connections"): the messages come back and their hops run twice.
        broker_transport_options={"visibility_timeout": 3600, "max_connections": 1000},
    )  # fmt: skip
    _state: dict[str, Any] = {}
    lock = threading.Lock()

    def engine() -> Engine:
        with lock:
            if "engine" not in _state:
                _state["engine"] = floor_engine(os.environ["BENCH_FLOOR_DB"])
            return _state["engine"]  # type: ignore[no-any-return]

    @app.task(name=HOP_TASK, bind=True, acks_late=True, shared=False)
    def hop(
        self: Task, run_id: str, n: int, total: int, io: str | None = None, client: str = "raw", side: str | None = None
    ) -> None:
        if io and n % 2 == 0:
            io_call(io, run_id, client=client)
        commit_hop(engine(), run_id, n, total, PAYLOAD)
        if n + 1 < total:
            # With `side`, the hops without the call go there, as Ratchet's tool batches go to theirs.
            nxt = side if side and (n + 1) % 2 else queue
            hop.apply_async((run_id, n + 1, total, io, client, side), queue=nxt)

    @app.task(name=STREAM_HOP_TASK, acks_late=True, shared=False)
    def stream_hop(run_id: str, io: str, key: str) -> None:
        commit_hop(engine(), run_id, 0, 1, stream_call(io, run_id, key))

    return app


def commit_hop(engine: Engine, run_id: str, n: int, total: int, content: str) -> None:
    """A hop's one transaction: append its message row, update the run row."""
    now = time.time()
    with engine.begin() as conn:
        conn.execute(
            insert(floor_messages).values(run_id=run_id, idx=n, role="assistant", content=content, created_at=now)
        )
        conn.execute(
            update(floor_runs).where(floor_runs.c.run_id == run_id)
            .values(seq=n + 1, updated_at=now, status="DONE" if n + 1 >= total else "QUEUED")
        )  # fmt: skip


_local = threading.local()


def io_call(base_url: str, run_id: str, *, client: str = "raw") -> None:
    """One Chat Completions request to the scripted server on a kept-alive connection: a bare
    `http.client` request (`raw`), or through the openai client as Ratchet's adapter sends it."""
    if client == "openai":
        _openai_call(base_url, run_id)
        return
    conn: http.client.HTTPConnection | None = getattr(_local, "conn", None)
    parts = urlsplit(base_url)
    if conn is None:
        conn = _local.conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    body = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "hop"}]})
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench", "X-Ratchet-Run-Id": run_id}
    try:
        conn.request("POST", parts.path + "/chat/completions", body, headers)
        conn.getresponse().read()
    except (OSError, http.client.HTTPException):
        conn.close()
        _local.conn = None
        raise


def _openai_call(base_url: str, run_id: str) -> None:
    """The same request through the openai client, sent as Ratchet's adapter sends it (`post`,
    the reply read as its JSON, not built into a `ChatCompletion`)."""
    body = {"model": "scripted", "messages": [{"role": "user", "content": "hop"}]}
    headers = {"X-Ratchet-Run-Id": run_id}
    _openai(base_url).post("/chat/completions", body=body, cast_to=object, options={"headers": headers})


_shared: dict[str, Any] = {}


def _openai(base_url: str) -> openai.OpenAI:
    """This thread's openai client (kept alive between hops, as Ratchet's adapter keeps its own).
    On a green pool, one client for the process: Celery's gevent pool runs each task in a new
    greenlet, whose "thread-local" client would be a new one (a new connection, a new TLS
    context: ~25 ms of CPU a hop) every hop."""
    import openai

    if _green():
        with _shared_lock:
            if base_url not in _shared:
                _shared[base_url] = openai.OpenAI(base_url=base_url, api_key="sk-bench", max_retries=0, timeout=30)
            return _shared[base_url]  # type: ignore[no-any-return]
    client: openai.OpenAI | None = getattr(_local, "client", None)
    if client is None:
        client = _local.client = openai.OpenAI(base_url=base_url, api_key="sk-bench", max_retries=0, timeout=30)
    return client


_shared_lock = threading.Lock()


def _green() -> bool:
    """Whether gevent has patched this process (`celery worker -P gevent`)."""
    monkey = sys.modules.get("gevent.monkey")
    return bool(monkey and monkey.is_module_patched("threading"))


def stream_call(base_url: str, run_id: str, key: str) -> str:
    """Stream one reply through the openai client, opened and read as Ratchet's adapter does it
    (`post` with `stream: true`, the usage asked for in the last chunk, each chunk read as its
    JSON object, not built into a `ChatCompletionChunk`), and XADD each text delta to the Redis
    stream `key` with the stream's EXPIRE, one round trip a delta, as Ratchet's delta sink writes
    its own; returns the whole text."""
    import openai

    r: redis.Redis | None = getattr(_local, "redis", None)
    if r is None:
        r = _local.redis = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    body = {
        "model": "scripted", "messages": [{"role": "user", "content": "hop"}], "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    stream = _openai(base_url).post(
        "/chat/completions", body=body, cast_to=object, options={"headers": {"X-Ratchet-Run-Id": run_id}},
        stream=True, stream_cls=openai.Stream[object],
    )  # fmt: skip
    parts: list[str] = []
    with stream:
        for chunk in stream:
            text = chunk["choices"][0]["delta"].get("content") if chunk.get("choices") else None
            if text:
                parts.append(text)
                pipe = r.pipeline(transaction=False)
                pipe.xadd(
                    key,
                    {"d": json.dumps({"run_id": run_id, "k": len(parts), "t": time.time(), "text": text})},
                    maxlen=100_000,
                    approximate=True,
                )
                pipe.expire(key, 3600)
                pipe.execute()
    return "".join(parts)


def start_stream_hop(engine: Engine, app: Celery, run_id: str, queue: str, io: str, key: str) -> None:
    """Write the floor run's row and enqueue its one streaming hop (`stream_call` into `key`)."""
    now = time.time()
    with engine.begin() as conn:
        conn.execute(insert(floor_runs).values(run_id=run_id, status="QUEUED", seq=0, created_at=now, updated_at=now))
    app.send_task(STREAM_HOP_TASK, args=[run_id, io, key], queue=queue)


def start_chain(
    engine: Engine, app: Celery, run_id: str, total: int, queue: str, io: str | None = None, client: str = "raw",
    side: str | None = None,
) -> float:  # fmt: skip
    """Write the floor run's row, enqueue its first hop; returns the start time. `io`: the scripted
    server every other hop calls, with `client` (see `io_call`); `side`: the queue of the hops
    between those calls (default: `queue`)."""
    now = time.time()
    with engine.begin() as conn:
        conn.execute(insert(floor_runs).values(run_id=run_id, status="QUEUED", seq=0, created_at=now, updated_at=now))
    app.send_task(HOP_TASK, args=[run_id, 0, total, io, client, side], queue=queue)
    return now


def chains_done(engine: Engine, run_ids: list[str]) -> list[tuple[float, float]] | None:
    """(created_at, updated_at) of every chain if all are done, else None."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(floor_runs.c.status, floor_runs.c.created_at, floor_runs.c.updated_at)
            .where(floor_runs.c.run_id.in_(run_ids))
        ).all()  # fmt: skip
    if len(rows) < len(run_ids) or any(r.status != "DONE" for r in rows):
        return None
    return [(r.created_at, r.updated_at) for r in rows]


# ---------------------------------------------------------------- the physical limit


def redis_hop_ms(redis_url: str, queue: str, n: int) -> float:
    """Milliseconds per bare Redis hop: LPUSH a message, BRPOP it on a second connection."""
    producer = redis.Redis.from_url(redis_url)
    consumer = redis.Redis.from_url(redis_url)
    body = json.dumps({"run_id": "r", "seq": 0}).encode()
    producer.ping(), consumer.ping()
    t0 = time.perf_counter()
    for _ in range(n):
        producer.lpush(queue, body)
        consumer.brpop([queue], timeout=5)
    elapsed = time.perf_counter() - t0
    producer.close(), consumer.close()
    return elapsed / n * 1000


def raw_tx_ms(db_url: str, n: int) -> float:
    """Milliseconds per raw-driver transaction: the floor's INSERT and UPDATE, then COMMIT."""
    url = make_url(db_url)
    run_id = f"raw-{time.time_ns()}"
    if url.get_backend_name() == "sqlite":
        conn: Any = sqlite3.connect(url.database or "", isolation_level=None, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={SQLITE_SYNCHRONOUS}")
        begin, ph = "BEGIN IMMEDIATE", "?"
    else:
        conn = psycopg.connect(url.set(drivername="postgresql").render_as_string(hide_password=False))
        begin, ph = None, "%s"
    cur = conn.cursor()
    now = time.time()
    if begin:
        cur.execute(begin)
    cur.execute(f"INSERT INTO bench_floor_runs VALUES ({ph},'QUEUED',0,{ph},{ph})", (run_id, now, now))
    conn.commit()
    ins = f"INSERT INTO bench_floor_messages VALUES ({ph},{ph},'assistant',{ph},{ph})"
    upd = f"UPDATE bench_floor_runs SET seq={ph}, updated_at={ph} WHERE run_id={ph}"
    t0 = time.perf_counter()
    for i in range(n):
        if begin:
            cur.execute(begin)
        cur.execute(ins, (run_id, i, PAYLOAD, now))
        cur.execute(upd, (i + 1, now, run_id))
        conn.commit()
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed / n * 1000


def __getattr__(name: str) -> Any:
    # `celery -A bench.floor:app` builds the app from the environment.
    if name == "app":
        global app
        app = create_floor_app(os.environ["BENCH_REDIS_URL"], os.environ["BENCH_FLOOR_QUEUE"])
        return app
    raise AttributeError(name)
