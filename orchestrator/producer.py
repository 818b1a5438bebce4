"""`Agent` and `Team` as Python code uses them: the definitions of `orchestrator.agent` and
`orchestrator.team` with Agno's producer methods on top (`run`, `arun`, `start`, `continue_run`,
`get_session_state`), which start and read runs through a `Client`.

The definitions know no producer: the workers and the domain (routing, steps, delegation,
control, the store) read `AgentDefinition` and `TeamDefinition` only. This module sits above the
client, and nothing below imports it.

A run's content is stored as text and reads the same in every process. Where the caller holds
the definition, as here, a structured agent's answer is given as an instance of its own
`output_schema` (its members' too), parsed from the stored JSON.

    agent = Agent(name="support", model=OpenAIChat(id="gpt-4o-mini"))
    output = agent.run("hello", session_id="sess-A")
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any, Literal, Unpack, overload

from pydantic import BaseModel

from orchestrator import structured
from orchestrator.agent import AgentDefinition, AgentOptions
from orchestrator.client import Client, RunHandle
from orchestrator.errors import InvalidInputError
from orchestrator.events import RunEvent
from orchestrator.requirements import RunRequirement
from orchestrator.run import RunOutput
from orchestrator.team import TeamDefinition

_default_lock = threading.Lock()
_default_client: Client | None = None


class Agent(AgentDefinition):
    """An LLM agent. `run()` enqueues a durable run on the workers and waits for it.

    `client`: the producer client its runs start through (default: the one `use_client`
    installed, else one from the environment's settings)."""

    def __init__(self, *, client: Client | None = None, **definition: Unpack[AgentOptions]) -> None:
        self._client = client
        super().__init__(**definition)

    @property
    def client(self) -> Client:
        """The producer client: the one given, else the one `use_client` installed (as
        `orchestrator.testing.in_memory` does), else one from the environment's settings."""
        if self._client is not None:
            return self._client
        if _default_client is not None:
            return _default_client
        return Client()  # light: the store and the dispatcher behind it are cached per process

    def start(
        self,
        input: str,
        *,
        session_id: str | None = None,
        run_id: str | None = None,
        user_id: str | None = None,
        session_state: Mapping[str, Any] | None = None,
        stream: bool = False,
        priority: int | None = None,
        webhook: str | None = None,
        run_timeout: float | timedelta | None = None,
    ) -> RunHandle:
        """Enqueue a run and return at once with its handle, whose `wait()` gives the content as
        this agent's `output_schema`. `user_id`, `session_state` (merged over the session's
        stored state), `priority` (0-9, higher first), `webhook` (a URL told of each stop) and
        `run_timeout` (the run's deadline in seconds, default this agent's): see `Client.start`."""
        client = self.client
        started = client.start(
            self.name,
            input=input,
            session_id=session_id,
            run_id=run_id,
            stream=stream,
            user_id=user_id,
            session_state=session_state,
            priority=priority,
            webhook=webhook,
            run_timeout=run_timeout,
        )
        return AgentRunHandle(started.run_id, client, self)

    @overload
    def run(
        self,
        input: str,
        *,
        session_id: str | None = None,
        timeout: float | None = None,
        stream: Literal[False] = False,
        user_id: str | None = None,
        session_state: Mapping[str, Any] | None = None,
        priority: int | None = None,
        run_timeout: float | timedelta | None = None,
    ) -> RunOutput: ...

    @overload
    def run(
        self,
        input: str,
        *,
        session_id: str | None = None,
        timeout: float | None = None,
        stream: Literal[True],
        user_id: str | None = None,
        session_state: Mapping[str, Any] | None = None,
        priority: int | None = None,
        run_timeout: float | timedelta | None = None,
    ) -> Iterator[RunEvent]: ...

    def run(
        self,
        input: str,
        *,
        session_id: str | None = None,
        timeout: float | None = None,
        stream: bool = False,
        user_id: str | None = None,
        session_state: Mapping[str, Any] | None = None,
        priority: int | None = None,
        run_timeout: float | timedelta | None = None,
    ) -> RunOutput | Iterator[RunEvent]:
        """Enqueue a run and wait for it. Returns the output whatever the status (ERROR too),
        with the session's state after it (`RunOutput.session_state`), and for an agent with an
        `output_schema` the content as an instance of it.

        `stream=True` (Agno's shape): enqueue a streamed run and return an iterator of its events
        (`Client.stream`), text deltas included, that ends when the run is final or PAUSED.

        `timeout` bounds the wait (RunWaitTimeout; the run goes on); `run_timeout` bounds the run
        itself: its deadline, past which it is stopped in ERROR with RunTimeoutError (`Client.start`)."""
        handle = self.start(
            input,
            session_id=session_id,
            user_id=user_id,
            session_state=session_state,
            stream=stream,
            priority=priority,
            run_timeout=run_timeout,
        )
        return self.client.stream(handle.run_id, timeout=timeout) if stream else handle.wait(timeout)

    @overload
    async def arun(
        self,
        input: str,
        *,
        session_id: str | None = None,
        timeout: float | None = None,
        stream: Literal[False] = False,
        user_id: str | None = None,
        session_state: Mapping[str, Any] | None = None,
        priority: int | None = None,
        run_timeout: float | timedelta | None = None,
    ) -> RunOutput: ...

    @overload
    async def arun(
        self,
        input: str,
        *,
        session_id: str | None = None,
        timeout: float | None = None,
        stream: Literal[True],
        user_id: str | None = None,
        session_state: Mapping[str, Any] | None = None,
        priority: int | None = None,
        run_timeout: float | timedelta | None = None,
    ) -> AsyncIterator[RunEvent]: ...

    async def arun(
        self,
        input: str,
        *,
        session_id: str | None = None,
        timeout: float | None = None,
        stream: bool = False,
        user_id: str | None = None,
        session_state: Mapping[str, Any] | None = None,
        priority: int | None = None,
        run_timeout: float | timedelta | None = None,
    ) -> RunOutput | AsyncIterator[RunEvent]:
        """`run()` for asyncio: the wait does not block the event loop. With `stream=True`,
        `async for event in await agent.arun(input, stream=True)`."""
        client = self.client
        handle = await asyncio.to_thread(
            self.start,
            input,
            session_id=session_id,
            user_id=user_id,
            session_state=session_state,
            stream=stream,
            priority=priority,
            run_timeout=run_timeout,
        )
        return client.astream(handle.run_id, timeout=timeout) if stream else await handle.await_(timeout)

    def get_session_state(self, session_id: str, *, user_id: str | None = None) -> dict[str, Any]:
        """The session's state as stored now (Agno's `get_session_state`); {} for a new session,
        and with `user_id` for a session that is not that user's (`Client.get_session_state`)."""
        return self.client.get_session_state(session_id, user_id=user_id)

    def continue_run(
        self,
        run_response: RunOutput | str | None = None,
        *,
        run_id: str | None = None,
        requirements: Sequence[RunRequirement] | None = None,
        input: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        fork_key: str | None = None,
        by: str | None = None,
        run_timeout: float | timedelta | None = None,
        accept_definition: str | Mapping[str, str] | None = None,
    ) -> RunOutput:
        """Continue a run and wait (Agno's `continue_run(run_response, run_id=, requirements=)`):
        ERROR resumes in place (same run_id), COMPLETED forks (the same fork for the same input;
        another `fork_key` forks again, see `Client.continue_run`), PAUSED resumes in place once
        every requirement is decided: the decisions made on `requirements` (default: those of
        `run_response`) are stored first. A run still waiting for decisions returns PAUSED.
        `accept_definition`: a definition a deploy's DefinitionChangedError names, accepted
        (`Client.continue_run`).

        `session_id` is accepted for Agno compatibility; the run id alone finds the run.
        `run_timeout`: a new deadline for the run that goes on (`Client.continue_run`)."""
        target, asked = _continued(run_response, run_id, requirements)
        handle = self.client.continue_run(
            target,
            input=input,
            fork_key=fork_key,
            requirements=asked,
            by=by,
            run_timeout=run_timeout,
            accept_definition=accept_definition,
        )
        return as_defined(self, handle.wait(timeout))

    async def acontinue_run(
        self,
        run_response: RunOutput | str | None = None,
        *,
        run_id: str | None = None,
        requirements: Sequence[RunRequirement] | None = None,
        input: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        fork_key: str | None = None,
        by: str | None = None,
        run_timeout: float | timedelta | None = None,
        accept_definition: str | Mapping[str, str] | None = None,
    ) -> RunOutput:
        """`continue_run()` for asyncio."""
        target, asked = _continued(run_response, run_id, requirements)
        handle = await asyncio.to_thread(
            self.client.continue_run,
            target,
            input=input,
            fork_key=fork_key,
            requirements=asked,
            by=by,
            run_timeout=run_timeout,
            accept_definition=accept_definition,
        )
        return as_defined(self, await handle.await_(timeout))


def _continued(
    run_response: RunOutput | str | None, run_id: str | None, requirements: Sequence[RunRequirement] | None
) -> tuple[str, Sequence[RunRequirement]]:
    """The run a continue is for and the requirements it carries, from Agno's arguments."""
    if isinstance(run_response, RunOutput):
        return run_id or run_response.run_id, requirements if requirements is not None else run_response.requirements
    target = run_id if run_id is not None else run_response
    if target is None:
        raise InvalidInputError("continue_run needs the run: pass its RunOutput or run_id=")
    return target, requirements or ()


class Team(TeamDefinition, Agent):
    """A team of agents (and teams) led by a model. Agno's `Team`, run durably: `run()` and the
    other producer methods are `Agent`'s, `client=` too."""


class AgentRunHandle(RunHandle):
    """A run started from an agent: waiting for it gives its output as that agent defines it
    (`as_defined`)."""

    def __init__(self, run_id: str, client: Client, agent: AgentDefinition) -> None:
        super().__init__(run_id, client)
        self.agent = agent

    def wait(self, timeout: float | None = None) -> RunOutput:
        """`RunHandle.wait`, with the content as the agent's `output_schema`."""
        return as_defined(self.agent, super().wait(timeout))

    async def await_(self, timeout: float | None = None) -> RunOutput:
        """`RunHandle.await_`, with the content as the agent's `output_schema`."""
        return as_defined(self.agent, await super().await_(timeout))


def as_defined(agent: AgentDefinition, output: RunOutput) -> RunOutput:
    """`output` with the content of each run in it (member runs too) as an instance of the
    `output_schema` of its definition under `agent` (the agent, a team's members), where the
    stored JSON follows it; runs of an agent without one, or not under `agent`, as stored."""
    schemas = {d.name: d.output_schema for d in agent.definitions() if d.output_schema is not None}
    return _parsed(output, schemas) if schemas else output


def _parsed(output: RunOutput, schemas: Mapping[str, type[BaseModel]]) -> RunOutput:
    schema = schemas.get(output.agent_name)
    content = output.content if schema is None else structured.parsed(schema, output.content)
    members = [_parsed(member, schemas) for member in output.member_runs]
    return replace(output, content=content, member_runs=members)


def use_client(client: Client | None) -> Client | None:
    """Make `client` the producer client of every agent built without one (None: each builds
    one from the environment again); returns the one it replaces, to restore it afterwards."""
    global _default_client
    with _default_lock:
        previous, _default_client = _default_client, client
    return previous
