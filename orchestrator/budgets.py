"""Spending limits that pause a run: `max_tokens=` and `max_cost=` on an agent or a team, for each
run, each session and each user (`session_max_tokens=`, `user_max_cost=`, ...).

    Agent(name="support", model=OpenAIChat(id="gpt-4o", prices=Prices(input=2.5, output=10)),
          max_cost=0.50, session_max_cost=5.0, user_max_tokens=2_000_000)

What is counted: the usage stored with each reply (`orchestrator.usage`), input plus output
tokens, and the cost at the model's prices when the reply was made. A run's spend is its own
replies' and, for a team, its members' at any depth; a session's, every run of the session (its
members' too); a user's, every run with that `user_id`. A run without a `user_id` has no user
budget to spend. Only committed replies count, read before each model call: a step that crashed
before its commit never counts twice, and one that failed with its reply flushed onto the ERROR row
counts that reply, which was paid for. A count the provider did not report counts as 0, and a reply
without a cost (a model without prices) costs 0: so a cost budget needs prices, and an agent or a
team whose cost budget would count a model without them is refused when it is defined
(ConfigurationError); runs of other agents in the same session or of the same user can still have
no prices, and add nothing to that total.

When: before each model call of the agent's run (never inside a tool batch: a batch in flight,
a team's delegation included, runs to its end). A limit is spent when what was spent reached it;
the call that crosses it is not cut short, so a run may end one call above its limit. A team's
budget is checked before its leader's calls: its members count, and their runs go on with their
own budgets (or none).

What then: the run moves to PAUSED before its call, holding nothing, with one requirement of
pause_type "budget" whose `budget` says {"limit": "max_cost" | "max_tokens", "scope": "run" |
"session" | "user", "spent": ..., "allowed": ...}. Raising it (`req.raise_budget(max_cost=...)`,
then `continue_run(run_id, requirements=[req])`, or `Client.decide` with a "budget" decision)
resumes the run in place. The raised value is that run's limit for that scope from then on (the
latest raise of each wins); other runs of the session or user keep the agent's. A run that spends
past the raised limit pauses again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypedDict, Unpack

from orchestrator.errors import ConfigurationError
from orchestrator.requirements import RunRequirement

Scope = Literal["run", "session", "user"]
LimitName = Literal["max_tokens", "max_cost"]
SCOPES: tuple[Scope, ...] = ("run", "session", "user")
LIMITS: tuple[LimitName, ...] = ("max_tokens", "max_cost")
#: The parameter of an agent that sets a scope's limit: `max_cost` (run), `session_max_cost`, ...
PREFIX: dict[Scope, str] = {"run": "", "session": "session_", "user": "user_"}


class BudgetOptions(TypedDict, total=False):
    """An agent's (or team's) budget parameters: a limit for each run, session and user."""

    #: Per run (a team's counts its members' runs): input plus output tokens, and cost.
    max_tokens: int | None
    max_cost: float | None
    #: Per session: every run of the session.
    session_max_tokens: int | None
    session_max_cost: float | None
    #: Per user: every run with the run's user_id.
    user_max_tokens: int | None
    user_max_cost: float | None


@dataclass(frozen=True, kw_only=True)
class Budget:
    """The limits of one scope; None: no limit."""

    max_tokens: int | None = None
    max_cost: float | None = None

    def limits(self) -> Iterator[tuple[LimitName, float]]:
        """Each limit set, tokens first."""
        for name in LIMITS:
            value = getattr(self, name)
            if value is not None:
                yield name, value


@dataclass(frozen=True, kw_only=True)
class Spend:
    """What a scope spent: tokens (input plus output) and cost, of its stored replies."""

    tokens: int = 0
    cost: float = 0.0

    def of(self, limit: LimitName) -> float:
        return self.tokens if limit == "max_tokens" else self.cost


@dataclass(frozen=True, kw_only=True)
class Spending:
    """What the store read for a budget check: each scope's spend, and the run's decided budget
    requirements (the raises), oldest first."""

    spent: Mapping[Scope, Spend] = field(default_factory=dict)
    raises: tuple[RunRequirement, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Budgets:
    """An agent's (or team's) limits, by scope: `agent.budgets`. Empty (false) when none is set."""

    run: Budget = Budget()
    session: Budget = Budget()
    user: Budget = Budget()

    @classmethod
    def of(cls, owner: str, **options: Unpack[BudgetOptions]) -> Budgets:
        """The limits from an agent's parameters (`max_tokens`, `session_max_cost`, ...), checked:
        ConfigurationError naming `owner` and the parameter for one that cannot work."""
        given: dict[str, Any] = dict(options)
        scopes: dict[str, Budget] = {}
        for scope in SCOPES:
            limits = {name: PREFIX[scope] + name for name in LIMITS}
            values = {
                name: _checked(owner, parameter, given.pop(parameter, None)) for name, parameter in limits.items()
            }
            scopes[scope] = Budget(**values)  # type: ignore[arg-type]
        if given:  # what Python says of an argument nobody takes
            raise TypeError(f"{owner}: unexpected keyword argument(s) {', '.join(sorted(given))}")
        return cls(**scopes)

    def __bool__(self) -> bool:
        return any(True for _ in self.limits())

    def of_scope(self, scope: Scope) -> Budget:
        budget: Budget = getattr(self, scope)
        return budget

    def limits(self) -> Iterator[tuple[Scope, LimitName, float]]:
        """Each limit set: run, session then user; tokens before cost in each."""
        for scope in SCOPES:
            for name, value in self.of_scope(scope).limits():
                yield scope, name, value

    @property
    def scopes(self) -> tuple[Scope, ...]:
        """The scopes with a limit: what a check reads the spend of."""
        return tuple(s for s in SCOPES if any(True for _ in self.of_scope(s).limits()))

    @property
    def counts_cost(self) -> bool:
        """Whether a cost limit is set (it needs prices)."""
        return any(name == "max_cost" for _, name, _ in self.limits())

    def raised(self, raises: Iterable[RunRequirement]) -> Budgets:
        """These limits with a run's decided budget raises applied, oldest first: each raises
        the limits it names in the scope its requirement was spent in."""
        out = self
        for requirement in raises:
            scope = (requirement.budget or {}).get("scope")
            values = requirement.decision.values if requirement.decision is not None else None
            if scope not in SCOPES or not values:
                continue
            current = out.of_scope(scope)
            wanted = {k: v for k, v in values.items() if k in LIMITS}
            out = replace(out, **{scope: replace(current, **wanted)})
        return out

    def spent(self, spending: Spending) -> dict[str, Any] | None:
        """The first limit whose scope spent what it allows, as a budget requirement says it
        ({"limit", "scope", "spent", "allowed"}); None while every limit has room left."""
        for scope, name, allowed in self.limits():
            spend = spending.spent.get(scope)
            if spend is not None and spend.of(name) >= allowed:
                return {"limit": name, "scope": scope, "spent": spend.of(name), "allowed": allowed}
        return None

    def to_json(self) -> dict[str, dict[str, float]]:
        """The limits set, by scope, as the agent catalog records them ({} when none)."""
        out: dict[str, dict[str, float]] = {}
        for scope, name, value in self.limits():
            out.setdefault(scope, {})[name] = value
        return out


def _checked(owner: str, parameter: str, value: object) -> int | float | None:
    """A limit as given: None, a whole number of tokens from 1, or a finite cost above 0."""
    if value is None:
        return None
    tokens = parameter.endswith("max_tokens")
    if tokens and isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if not tokens and isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf:
        return float(value)
    what = "a whole number of tokens, 1 or more" if tokens else "a finite cost above 0 (US dollars)"
    raise ConfigurationError(f"{owner}: {parameter} is {what}; got {value!r}: give one, or leave it out for no limit")


__all__ = ["Budget", "BudgetOptions", "Budgets", "LimitName", "Scope", "Spend", "Spending"]
