"""Producers: Celery tasks sent by name with JSON arguments by code that does not import the
agents; the same start or continue sent twice (one run, one fork); a producer whose broker is
down or never answers at enqueue time (the run is kept and published later)."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from orchestrator import (
    Agent,
    BrokerUnavailableError,
    Client,
    RunConflictError,
    RunNotFoundError,
    RunOutput,
    RunStatus,
    Session,
)
from orchestrator.models import OpenAIChat
from orchestrator.settings import Settings
from orchestrator.sweeper import Sweeper
from orchestrator.testing.waiting import wait_until
from tests.integration.producing import complete
from workers.celery.app import create_app
from workers.celery.broker import queue_lists
from workers.celery.embedded import EmbeddedWorker
from workers.celery.tasks import runner_for


@pytest.mark.usefixtures("worker", "scripted")
def test_a_plain_celery_producer_starts_and_continues_runs_by_task_name(settings: Settings) -> None:
    name = f"by-name-{uuid.uuid4().hex[:6]}"
    Agent(name=name, model=OpenAIChat(id="gpt-4o-mini"), instructions="Be brief.")
    # A producer that knows only the broker URL, the task name and the queue.
    producer = Celery(broker=settings.broker_url, set_as_current=False)
    producer.conf.task_serializer = "json"
    run_id = str(uuid.uuid4())

    producer.send_task(
        "ratchet.start_run", args=[name, "hello by name", "s-by-name", run_id], kwargs={"priority": 6},
        queue=settings.control_queue,
    )  # fmt: skip

    client = Client(settings)
    wait_until(lambda: client.get_run(run_id), 30, what="the run to be written", ignore=(RunNotFoundError,))
    out = client.wait(run_id, timeout=30)
    assert out.status == RunStatus.COMPLETED and out.session_id == "s-by-name" and out.priority == 6
    assert [m.content for m in out.messages if m.role == "user"] == ["hello by name"]

    # Redelivering the same start_run (at-least-once) does not start the run twice.
    producer.send_task(
        "ratchet.start_run", args=[name, "hello by name", "s-by-name", run_id], queue=settings.control_queue
    )
    producer.send_task("ratchet.continue_run", args=[run_id, "and again"], queue=settings.control_queue)

    def fork_finished() -> Session | None:
        s = client.get_session("s-by-name")
        # Every run final, however many: the count below is then what is checked, not waited for.
        return s if s and len(s.runs) >= 2 and all(r.status.is_final for r in s.runs) else None

    session = wait_until(fork_finished, 30, what="the continued run's fork to finish")
    assert len(session.runs) == 2  # the original and one fork from continue
    assert session.runs[1].forked_from == run_id and session.runs[1].priority == 6  # a fork keeps it
    producer.close()


@pytest.mark.usefixtures("worker", "scripted")
def test_a_run_enqueued_while_the_broker_is_down_is_kept_and_runs_once_it_is_back(settings: Settings) -> None:
    name = f"down-{uuid.uuid4().hex[:6]}"
    Agent(name=name, model=OpenAIChat(id="gpt-4o-mini"), instructions="Be brief.")
    down = Client(settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"}))

    with pytest.raises(BrokerUnavailableError, match="saved as QUEUED .* nothing is lost") as caught:
        down.start(name, input="are you there?")

    client = Client(settings)
    run_id = caught.value.run_id
    assert client.get_run(run_id).messages[0].content == "are you there?"
    # The sweeper of the worker, whose broker is up, publishes it: nobody re-sends anything.
    out = client.wait(run_id, timeout=30)
    assert out.status == RunStatus.COMPLETED


# ---------------------------------------------------------------- one key, one run


def test_starting_twice_with_one_run_id_returns_the_first_run_and_publishes_once(settings: Settings) -> None:
    name = f"keyed-{uuid.uuid4().hex[:6]}"
    client = Client(settings)
    run_id, session_id = f"order-{uuid.uuid4().hex[:8]}", f"s-{uuid.uuid4().hex[:8]}"

    first = client.start(name, input="hello", session_id=session_id, run_id=run_id)
    again = client.start(name, input="hello", session_id=session_id, run_id=run_id)
    unsessioned = client.start(name, input="hello", run_id=run_id)  # no session given: not compared

    assert first.run_id == again.run_id == unsessioned.run_id == run_id
    session = client.get_session(session_id)
    assert session is not None and [r.run_id for r in session.runs] == [run_id]
    assert [m.content for m in session.runs[0].messages] == ["hello"]
    assert queued_steps(settings) == 1  # the repeats published nothing


def test_starting_a_taken_run_id_for_another_agent_or_session_is_a_conflict(settings: Settings) -> None:
    name = f"keyed-{uuid.uuid4().hex[:6]}"
    client = Client(settings)
    run_id = f"order-{uuid.uuid4().hex[:8]}"
    client.start(name, input="hello", session_id="s-first", run_id=run_id)

    with pytest.raises(RunConflictError, match=f"'{run_id}' is already a run of agent '{name}' in session 's-first'"):
        client.start("another-agent", input="hello", run_id=run_id)
    with pytest.raises(RunConflictError, match="in session 's-other' needs a run_id of its own"):
        client.start(name, input="hello", session_id="s-other", run_id=run_id)

    assert client.get_session("s-other") is None
    assert client.get_run(run_id).agent_name == name


def test_continuing_a_completed_run_twice_alike_forks_once_and_a_fork_key_forks_again(settings: Settings) -> None:
    # Given a COMPLETED run
    client = Client(settings)
    source = client.start(f"forked-{uuid.uuid4().hex[:6]}", input="hello").run_id
    complete(client.store, source)

    # When it is continued twice with the same input, and twice at once (a double click)
    fork = client.continue_run(source, input="and then?").run_id
    assert client.continue_run(source, input="and then?").run_id == fork
    barrier = threading.Barrier(2)
    clicks: list[str] = []

    def click() -> None:
        barrier.wait()
        clicks.append(client.continue_run(source, input="once more").run_id)

    threads = [threading.Thread(target=click) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    # Then each request made one fork; a fork key (twice) and a continue without input make others
    assert len(clicks) == 2 and clicks[0] == clicks[1]
    keyed = client.continue_run(source, input="and then?", fork_key="try-2").run_id
    assert client.continue_run(source, input="and then?", fork_key="try-2").run_id == keyed
    bare = client.continue_run(source).run_id
    assert len({source, fork, clicks[0], keyed, bare}) == 5
    session = client.get_session(client.get_run(source).session_id)
    assert session is not None
    assert sorted(r.run_id for r in session.runs) == sorted([source, fork, clicks[0], keyed, bare])
    assert all(r.forked_from == source for r in session.runs if r.run_id != source)
    assert [m.content for m in client.get_run(fork).messages] == ["hello", "done", "and then?"]
    assert queued_steps(settings) == 5  # the start and four forks, each published once


@pytest.mark.usefixtures("scripted")
def test_celery_producers_that_send_a_start_or_a_continue_twice_get_one_run(settings: Settings) -> None:
    name = f"by-name-{uuid.uuid4().hex[:6]}"
    Agent(name=name, model=OpenAIChat(id="gpt-4o-mini"), instructions="Be brief.")
    producer = Celery(broker=settings.broker_url, set_as_current=False)
    producer.conf.task_serializer = "json"
    client = Client(settings)
    unkeyed, keyed = f"s-{uuid.uuid4().hex[:8]}", f"s-{uuid.uuid4().hex[:8]}"
    run_id, task_id = f"order-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())

    def send(task: str, *args: object, **kwargs: object) -> None:
        producer.send_task(task, args=list(args), kwargs=kwargs, queue=settings.control_queue)

    # One worker slot: the control queue's tasks run one after the other, in the order sent, so
    # once a marker sent last has started a run, every task sent before it has been handled.
    with EmbeddedWorker(settings, concurrency=1):
        # A message delivered twice (same task id, no run id), and a start sent twice with one run id
        for _ in range(2):
            producer.send_task(
                "ratchet.start_run", args=[name, "hello", unkeyed], task_id=task_id, queue=settings.control_queue
            )
        send("ratchet.start_run", name, "hello", keyed, run_id)
        send("ratchet.start_run", name, "hello", keyed, run_id)
        handled(producer, client, settings, name)

        assert [len(runs_of(client, s)) for s in (unkeyed, keyed)] == [1, 1]
        assert client.wait(run_id, timeout=30).status == RunStatus.COMPLETED

        # A continue of the COMPLETED run sent twice forks once; one with a fork key forks again
        send("ratchet.continue_run", run_id, "and then?")
        send("ratchet.continue_run", run_id, "and then?")
        send("ratchet.continue_run", run_id, "and then?", fork_key="try-2")
        handled(producer, client, settings, name)

    forks = [r for r in runs_of(client, keyed) if r.forked_from == run_id]
    assert len(forks) == 2
    producer.close()


def queued_steps(settings: Settings) -> int:
    """Step messages waiting on this test's model queue (no worker consumes it)."""
    client = redis.Redis.from_url(settings.broker_url)
    return sum(int(client.llen(name)) for name in queue_lists(settings.model_queue))


def runs_of(client: Client, session_id: str) -> list[RunOutput]:
    session = client.get_session(session_id)
    return session.runs if session is not None else []


def handled(producer: Celery, client: Client, settings: Settings, agent: str) -> None:
    """Send a marker start and wait until it has made its run (see the test above)."""
    marker = f"marker-{uuid.uuid4().hex[:8]}"
    producer.send_task("ratchet.start_run", args=[agent, "marker", None, marker], queue=settings.control_queue)
    wait_until(lambda: client.get_run(marker), 30, what="the marker run", ignore=(RunNotFoundError,))


# ---------------------------------------------------------------- a broker that never answers


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """A TCP server on 127.0.0.1 that accepts connections and never answers: a hung Redis, or a
    load balancer in front of a dead one."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.05)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    done.set()
    thread.join(5)
    server.close()
    for conn in held:
        conn.close()


def test_a_broker_that_never_answers_fails_start_in_seconds_and_the_sweeper_publishes_the_run_later(
    settings: Settings, silent_broker: str
) -> None:
    hung = Client(settings.model_copy(update={"broker_url": silent_broker}))

    began = time.monotonic()
    with pytest.raises(BrokerUnavailableError, match="saved as QUEUED .* nothing is lost") as caught:
        hung.start("anyone", input="are you there?")

    assert time.monotonic() - began < 10
    store = hung.store
    record = store.get_record(caught.value.run_id)
    assert record.status == RunStatus.QUEUED
    assert record.publish_after is not None and record.publish_after <= store.clock()  # due now
    # A sweeper whose broker answers publishes it
    app = create_app(settings)
    try:
        assert caught.value.run_id in Sweeper(runner_for(app)).sweep_once().republished
    finally:
        app.close()
    assert queued_steps(settings) == 1


@pytest.mark.usefixtures("worker", "scripted")
def test_a_celery_producer_starts_a_streamed_run_by_task_name_and_a_reader_follows_its_text(
    settings: Settings,
) -> None:
    name = f"streamed-{uuid.uuid4().hex[:6]}"
    Agent(name=name, model=OpenAIChat(id="gpt-4o-mini"), instructions="Be brief.")
    producer = Celery(broker=settings.broker_url, set_as_current=False)
    producer.conf.task_serializer = "json"
    run_id = str(uuid.uuid4())

    producer.send_task(
        "ratchet.start_run", args=[name, "hello", None, run_id], kwargs={"stream": True},
        queue=settings.control_queue,
    )  # fmt: skip

    client = Client(settings)
    wait_until(lambda: client.get_run(run_id), 30, what="the run to be written", ignore=(RunNotFoundError,))
    events = list(client.stream(run_id))
    out = client.get_run(run_id)
    assert out.status == RunStatus.COMPLETED
    text = "".join(e.content or "" for e in events if e.event == "RunContent")
    assert text and text == out.content  # the deltas are the committed reply, as it was written
    assert events[-1].event == "RunCompleted"
    producer.close()
