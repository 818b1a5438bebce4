"""Toolkits: tools grouped under a name, in the shape Agno users write them.

    class Weather(Toolkit):
        def __init__(self, api_key: str) -> None:
            self.api_key = api_key
            super().__init__(name="weather", tools=[self.forecast, self.alerts])

        def forecast(self, city: str) -> str:
            \"\"\"Tomorrow's forecast for a city.

            Args:
                city: The city's name, e.g. "Lisbon".
            \"\"\"

    Agent(name="forecaster", model=..., tools=[Weather(api_key=...)])

An agent given a toolkit offers each of its tools to the model under the tool's own name (a
toolkit is a grouping, not a namespace). A toolkit is built again in every worker process with
the agent's module, so what it holds (a client, a key) is runtime state, never persisted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.errors import ConfigurationError
from orchestrator.tools.tool import Tool, as_tool, queue_name


class Toolkit:
    """A named group of tools, with optional instructions for the model on how to use them.

    `include_tools` keeps only the named tools, `exclude_tools` drops the named ones; naming a
    tool the toolkit does not have is a configuration error. With `add_instructions=True` the
    toolkit's `instructions` join the system message of the agent that uses it. `queue`: the
    queue of its tools that name none themselves (see `Tool.queue`).
    """

    def __init__(
        self,
        name: str = "toolkit",
        tools: Sequence[Tool | Callable[..., Any]] = (),
        *,
        instructions: str | None = None,
        add_instructions: bool = False,
        include_tools: Sequence[str] | None = None,
        exclude_tools: Sequence[str] | None = None,
        queue: str | None = None,
        requires_confirmation_tools: Sequence[str] | None = None,
        external_execution_required_tools: Sequence[str] | None = None,
    ) -> None:
        self.name = name
        #: Agno's lists: the named tools pause for a person's confirmation, or are run by the
        #: caller (`orchestrator.requirements`).
        self.requires_confirmation_tools = list(requires_confirmation_tools or ())
        self.external_execution_required_tools = list(external_execution_required_tools or ())
        self.queue = None if queue is None else queue_name(queue, f"toolkit {name}")
        self.instructions = instructions
        self.add_instructions = add_instructions
        self.include_tools = list(include_tools) if include_tools is not None else None
        self.exclude_tools = list(exclude_tools or ())
        #: The toolkit's tools by name, in the order they were registered.
        self.functions: dict[str, Tool] = {}
        self._offered: set[str] = set()  # every name registered, kept or left out
        for t in tools:
            self.register(t)

    def register(self, function: Tool | Callable[..., Any], name: str | None = None) -> None:
        """Add a tool (a function, a bound method or a `Tool`), unless include/exclude leave it out."""
        found = as_tool(function) if name is None else _renamed(function, name)
        if self.queue is not None and found.queue is None:
            found = found.with_flags(queue=self.queue)
        if found.name in self.requires_confirmation_tools and not found.requires_confirmation:
            found = found.with_flags(requires_confirmation=True)
        if found.name in self.external_execution_required_tools and not found.external_execution:
            found = found.with_flags(external_execution=True)
        self._offered.add(found.name)
        if found.name in self.exclude_tools:
            return
        if self.include_tools is not None and found.name not in self.include_tools:
            return
        if found.name in self.functions:
            raise ConfigurationError(f"toolkit {self.name}: two tools share the name {found.name!r}")
        self.functions[found.name] = found

    @property
    def tools(self) -> list[Tool]:
        """The toolkit's tools, checked against include/exclude (call after registering)."""
        self._check_names()
        return list(self.functions.values())

    def _check_names(self) -> None:
        named = set(self.include_tools or ()) | set(self.exclude_tools)
        named |= set(self.requires_confirmation_tools) | set(self.external_execution_required_tools)
        missing = sorted(named - self._offered)
        if missing:
            raise ConfigurationError(
                f"toolkit {self.name}: include/exclude or a human-in-the-loop list names tools it does not have: "
                f"{missing}"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, tools={list(self.functions)})"


def _renamed(function: Tool | Callable[..., Any], name: str) -> Tool:
    if isinstance(function, Tool):
        return function.with_flags(name=name)
    return Tool(function, name=name)


def flatten(tools: Sequence[Toolkit | Tool | Callable[..., Any]]) -> list[Tool]:
    """An agent's tools with each toolkit replaced by its tools."""
    flat: list[Tool] = []
    for t in tools:
        flat.extend(t.tools if isinstance(t, Toolkit) else [as_tool(t)])
    return flat
