"""Tools as Agno users write them, on a real Celery worker and the real openai client against
the scripted model, on SQLite and PostgreSQL: an agent given a Toolkit calls its methods, and an
async tool keeps the `httpx2.AsyncClient` it opened on its first call for its later calls, because
async tools run on one long-lived event loop per worker process, whichever worker thread calls."""

from __future__ import annotations

import asyncio
import uuid

import httpx2

from orchestrator import Agent, Client, RunStatus, Toolkit
from orchestrator.messages import Message
from orchestrator.models import OpenAIChat
from orchestrator.settings import Settings
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer
from workers.celery.embedded import EmbeddedWorker

S = RunStatus


class Shelf(Toolkit):
    """Books kept by the toolkit instance, which each worker process builds with the agent."""

    def __init__(self) -> None:
        self.books = ["Dune"]
        super().__init__(name="shelf", tools=[self.add_book, self.list_books])

    def add_book(self, title: str) -> str:
        """Put a book on the shelf.

        Args:
            title: The book's title.
        """
        self.books.append(title)
        return f"added {title}"

    def list_books(self) -> str:
        """The books on the shelf, in the order they were added."""
        return ", ".join(self.books)


class ModelsApi(Toolkit):
    """An async tool that opens one AsyncClient on its first call and reuses it."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.client: httpx2.AsyncClient | None = None
        self.clients: list[int] = []
        self.loops: list[int] = []
        super().__init__(name="models_api", tools=[self.count_models])

    async def count_models(self) -> str:
        """How many models the provider lists."""
        if self.client is None:
            self.client = httpx2.AsyncClient(base_url=self.base_url)
        self.clients.append(id(self.client))
        self.loops.append(id(asyncio.get_running_loop()))
        response = await self.client.get("/models")
        response.raise_for_status()
        return f"{len(response.json()['data'])} models"


def tool_messages(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m.role == "tool"]


def test_an_agent_with_a_toolkit_calls_its_methods_on_the_toolkit_instance(
    settings: Settings, scripted: ScriptedServer, worker: object
) -> None:
    # Given an agent whose tools are a toolkit's methods, and a model that adds then lists a book
    shelf = Shelf()
    agent = Agent(name=f"librarian-{uuid.uuid4().hex[:8]}", model=OpenAIChat(id="gpt-4o-mini"), tools=[shelf])
    scripted.configure(
        ScriptConfig(
            batches=[
                [{"tool": "add_book", "arguments": {"title": "Emma"}}],
                [{"tool": "list_books", "arguments": {}}],
            ]
        )
    )
    # When the run completes on the worker
    out = Client(settings).start(agent.name, input="shelve Emma").wait(timeout=60)
    # Then each call reached the toolkit instance and its result went back to the model
    assert out.status == S.COMPLETED, out.error
    results = tool_messages(out.messages)
    assert [(m.tool_name, m.content, m.tool_call_error) for m in results] == [
        ("add_book", "added Emma", False),
        ("list_books", "Dune, Emma", False),
    ]
    assert shelf.books == ["Dune", "Emma"]


def test_an_async_tool_reuses_its_client_across_steps_and_batches_on_a_worker(
    settings: Settings, scripted: ScriptedServer
) -> None:
    # Given an async tool that opens an AsyncClient on its first call, on a worker of 4 threads
    api = ModelsApi(scripted.url)
    agent = Agent(name=f"counter-{uuid.uuid4().hex[:8]}", model=OpenAIChat(id="gpt-4o-mini"), tools=[api])
    one = {"tool": "count_models", "arguments": {}}
    scripted.configure(ScriptConfig(batches=[[one], [one], [one, one]]))
    # When the model calls it in three tool steps, the last a batch of two concurrent calls
    with EmbeddedWorker(settings, concurrency=4):
        out = Client(settings).start(agent.name, input="count").wait(timeout=60)
    # Then every call used the client the first opened, on one loop, and all answered
    assert out.status == S.COMPLETED, out.error
    assert [(m.content, m.tool_call_error) for m in tool_messages(out.messages)] == [("1 models", False)] * 4
    assert len(api.clients) == 4 and len(set(api.clients)) == 1
    assert len(set(api.loops)) == 1
    assert [r["step"] for r in scripted.requests_for(out.run_id)] == ["0", "2", "4", "6"]
