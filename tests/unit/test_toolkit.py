"""Tools as Agno users write them: descriptions from the docstring (in Google, NumPy, reST or epydoc
style), and toolkits that group methods. Async tools' loop: tests/unit/test_tool_loop.py."""

from __future__ import annotations

from typing import Literal

import pytest

from orchestrator import Agent, Toolkit
from orchestrator.errors import ConfigurationError
from orchestrator.testing.scripted_model import ScriptedModel
from orchestrator.tools import Tool, ToolContext, tool
from orchestrator.tools.schema import docstring_parts


def get_weather(city: str, days: int = 1, units: Literal["c", "f"] = "c", context: ToolContext | None = None) -> str:
    """Get the forecast for a city.

    Looks it up in the weather service.

    Args:
        city: The city's name,
            as people write it.
        days (int): How many days ahead.
        units (str, optional): Celsius or Fahrenheit.

    Returns:
        The forecast as text.
    """
    return city


def test_each_parameter_takes_its_description_from_the_args_section() -> None:
    spec = Tool(get_weather).spec
    props = spec.parameters["properties"]
    assert props["city"] == {"type": "string", "description": "The city's name, as people write it."}
    assert props["days"] == {"type": "integer", "default": 1, "description": "How many days ahead."}
    assert props["units"]["enum"] == ["c", "f"]
    assert props["units"]["default"] == "c"
    assert props["units"]["description"] == "Celsius or Fahrenheit."
    assert spec.parameters["required"] == ["city"]


def test_the_summary_before_the_sections_stays_the_description() -> None:
    assert Tool(get_weather).spec.description == "Get the forecast for a city.\n\nLooks it up in the weather service."


def test_numpy_style_parameters_are_read_too() -> None:
    summary, params = docstring_parts(
        """Add two numbers.

        Parameters
        ----------
        a : int
            The first.
        b : int
            The second,
            on two lines.
        """
    )
    assert summary == "Add two numbers."
    assert params == {"a": "The first.", "b": "The second, on two lines."}


#: One tool's docstring in each style `docstring_parser` reads: Google, NumPy, reST and epydoc.
STYLES = {
    "google": """Charge a card.

    Once per key.

    Args:
        amount (int): How much, in cents,
            never negative.
        currency: The ISO code.

    Returns:
        The receipt.
    """,
    "numpy": """Charge a card.

    Once per key.

    Parameters
    ----------
    amount : int
        How much, in cents,
        never negative.
    currency : str
        The ISO code.

    Returns
    -------
    str
        The receipt.
    """,
    "rest": """Charge a card.

    Once per key.

    :param amount: How much, in cents,
        never negative.
    :type amount: int
    :param str currency: The ISO code.
    :returns: The receipt.
    """,
    "epydoc": """Charge a card.

    Once per key.

    @param amount: How much, in cents,
        never negative.
    @type amount: int
    @param currency: The ISO code.
    @return: The receipt.
    """,
}


@pytest.mark.parametrize("style", sorted(STYLES))
def test_every_docstring_style_gives_the_description_and_each_parameters_description(style: str) -> None:
    def charge(amount: int, currency: str = "EUR") -> str:
        return f"{amount} {currency}"

    charge.__doc__ = STYLES[style]
    spec = Tool(charge).spec
    assert spec.description == "Charge a card.\n\nOnce per key."
    props = spec.parameters["properties"]
    assert props["amount"] == {"type": "integer", "description": "How much, in cents, never negative."}
    assert props["currency"] == {"type": "string", "default": "EUR", "description": "The ISO code."}


def test_an_attributes_section_describes_no_parameter() -> None:
    summary, params = docstring_parts(
        """A shelf.

        Attributes:
            title: The shelf's own title.

        Args:
            size: How many books.
        """
    )
    assert summary == "A shelf."
    assert params == {"size": "How many books."}


def test_a_raises_item_without_its_colon_loses_no_parameter_description() -> None:
    summary, params = docstring_parts(
        """Add.

        Args:
            a: first

        Raises:
            ValueError: bad
            TypeError
        """
    )
    assert (summary, params) == ("Add.", {"a": "first"})


def test_an_args_line_without_its_colon_leaves_that_parameter_undescribed_and_keeps_the_others() -> None:
    def add(a: int, x: int, b: int) -> int:
        """Add.

        Args:
            a: first
            x the x
            b: second
        """
        return a + x + b

    spec = Tool(add).spec
    assert spec.description == "Add."
    assert spec.parameters["properties"] == {
        "a": {"type": "integer", "description": "first"},
        "x": {"type": "integer"},
        "b": {"type": "integer", "description": "second"},
    }


def test_a_section_no_style_reads_never_reaches_the_description() -> None:
    summary, params = docstring_parts(
        """Add.

        Args:

        Returns:
            The sum.
        """
    )
    assert (summary, params) == ("Add.", {})


def test_a_parameter_the_docstring_does_not_name_has_no_description() -> None:
    def f(a: int, b: int) -> int:
        """Sum.

        Args:
            a: the first
        """
        return a + b

    props = Tool(f).spec.parameters["properties"]
    assert props == {"a": {"type": "integer", "description": "the first"}, "b": {"type": "integer"}}


class Shelf(Toolkit):
    def __init__(self, **kwargs: object) -> None:
        self.books = ["Dune"]
        super().__init__(name="shelf", tools=[self.list_books, self.add_book, self.burn_all], **kwargs)  # type: ignore[arg-type]

    def list_books(self) -> str:
        """The books on the shelf."""
        return ", ".join(self.books)

    def add_book(self, title: str) -> str:
        """Put a book on the shelf.

        Args:
            title: The book's title.
        """
        self.books.append(title)
        return "ok"

    def burn_all(self) -> str:
        """Empty the shelf."""
        self.books.clear()
        return "gone"


def test_a_toolkit_registers_its_methods_as_tools_bound_to_its_state() -> None:
    shelf = Shelf()
    assert [t.name for t in shelf.tools] == ["list_books", "add_book", "burn_all"]
    add = shelf.functions["add_book"]
    assert add.spec.parameters["properties"]["title"] == {"type": "string", "description": "The book's title."}
    assert "self" not in add.spec.parameters["properties"]
    add.call(add.parse_arguments('{"title": "Emma"}'), ToolContext(run_id="r", tool_call_id="c"))
    assert shelf.books == ["Dune", "Emma"]


def test_include_and_exclude_choose_the_tools_offered() -> None:
    assert [t.name for t in Shelf(include_tools=["list_books"]).tools] == ["list_books"]
    assert [t.name for t in Shelf(exclude_tools=["burn_all"]).tools] == ["list_books", "add_book"]


def test_include_or_exclude_naming_a_missing_tool_is_refused_when_the_agent_is_defined() -> None:
    kit = Shelf(exclude_tools=["burn_everything"])
    with pytest.raises(ConfigurationError, match="burn_everything"):
        Agent(name="typo-shelf", model=ScriptedModel(script=[]), tools=[kit])


def test_a_toolkit_can_be_built_from_functions_and_tools() -> None:
    @tool(at_most_once=True)
    def pay(amount: int) -> str:
        """Pay."""
        return "paid"

    kit = Toolkit(name="money", tools=[pay, get_weather])
    assert [t.name for t in kit.tools] == ["pay", "get_weather"]
    assert kit.functions["pay"].at_most_once


def test_an_agent_offers_every_tool_of_its_toolkits_and_their_instructions() -> None:
    kit = Shelf(instructions="Only list books when asked.", add_instructions=True)
    agent = Agent(
        name="librarian-unit", model=ScriptedModel(script=[]), tools=[kit, get_weather], instructions="Be brief."
    )
    assert [s.name for s in agent.tool_specs()] == ["list_books", "add_book", "burn_all", "get_weather"]
    assert agent.render_system_message() == "Be brief.\n\nOnly list books when asked."


def test_an_agent_refuses_two_toolkits_offering_the_same_name() -> None:
    with pytest.raises(ConfigurationError, match="share a name"):
        Agent(name="twin-shelves", model=ScriptedModel(script=[]), tools=[Shelf(), Shelf()])


def test_a_tool_registered_under_another_name_keeps_its_settings() -> None:
    @tool(at_most_once=True)
    def pay(amount: int) -> str:
        """Pay."""
        return "paid"

    kit = Toolkit(name="money")
    kit.register(pay, name="pay_invoice")
    assert [t.name for t in kit.tools] == ["pay_invoice"]
    assert kit.functions["pay_invoice"].at_most_once
    assert kit.functions["pay_invoice"].spec.description == "Pay."
