"""A payment that needs a person's approval, given from another process.

`send_payment` is declared with `@tool(requires_confirmation=True)`: when the model calls it, the
run does not pay. It moves to PAUSED with one requirement for the call (its id, the tool and its
arguments) and holds nothing while it waits: no worker, no lease, no task in the broker. A second
producer, here another process with its own `Client`, finds what waits for a person
(`Client.pending`), approves it (`Client.decide`: the requirement's `confirm()`), and that last
decision queues the run again under the same run_id: the payment is made once, and the model
answers. A later, different decision on the same requirement is refused, naming who decided
first. The run's events tell it all: RunPaused with the requirement, RunRequirementDecided (who,
when, what), RunContinued.

Run it with `make demo` (SQLite, a broker that needs no server, an in-process worker, and the
project's scripted model unless OPENAI_API_KEY is set), or against your own Redis, PostgreSQL and
workers: `ratchet worker --app examples.approval`, then decide with `python examples/approval.py
--approve RUN_ID REQUIREMENT_ID` from anywhere.
"""

import subprocess
import sys

from orchestrator import Agent, Client, Decision, DecisionConflictError, RunRequirement, tool
from orchestrator.models import OpenAIChat
from orchestrator.testing.script import ScriptConfig

PAID: list[str] = []


@tool(requires_confirmation=True)
def send_payment(amount_eur: int, to: str) -> str:
    """Send a payment.

    Args:
        amount_eur: The amount, in euros.
        to: Who is paid.
    """
    PAID.append(to)
    return f"sent {amount_eur} EUR to {to}"


payments = Agent(
    name="payments",
    model=OpenAIChat(id="gpt-4o-mini"),
    tools=[send_payment],
    instructions="Pay the invoices you are asked to pay with send_payment, then say what you did.",
)

#: What the scripted model answers when OPENAI_API_KEY is not set.
SCRIPT = ScriptConfig(
    batches=[[{"tool": "send_payment", "arguments": {"amount_eur": 120, "to": "Ada Lovelace"}}]],
    final_text="Done: {tool_results}.",
)


def asked(req: RunRequirement) -> str:
    """The call a requirement is about, as the model made it."""
    call = req.tool_execution
    return f"{call.tool_name}({call.tool_args})" if call is not None else req.pause_type


def approve(run_id: str, requirement_id: str, by: str) -> None:
    """The second producer: another process, with a `Client` of its own."""
    client = Client()
    [waiting] = [r for r in client.pending(agent_name=payments.name) if r.id == requirement_id]
    print(f"  [approver, another process] {by} sees {asked(waiting)}")
    waiting.confirm()
    decided = client.decide(run_id, requirement_id, waiting, by=by)
    print(f"  [approver, another process] decided: {decided.decision.kind if decided.decision else '?'} by {by}")


def main() -> None:
    client = Client()
    out = payments.start("Pay Ada Lovelace's invoice of 120 EUR.").wait(timeout=120)
    print(f"run {out.run_id}: {out.status.value}, nothing paid yet: {PAID == []}")
    [req] = out.active_requirements
    print(f"  waiting for a person: {req.pause_type} of {asked(req)}")
    record = client.store.get_record(out.run_id)
    print(f"  held while PAUSED: lease={record.lease_owner}\n")

    subprocess.run([sys.executable, __file__, "--approve", out.run_id, req.id, "finance@example.com"], check=True)

    done = client.wait(out.run_id, timeout=120)
    print(f"\nrun {done.run_id}: {done.status.value} (the same run), paid once: {PAID}")
    print(f"  answer: {done.content}")
    try:
        client.decide(out.run_id, req.id, Decision(kind="reject", note="too late"), by="auditor@example.com")
    except DecisionConflictError as exc:
        print(f"  a later rejection is refused: {exc}")
    print("\nits events:")
    for event in client.stream(out.run_id):
        if event.event == "RunPaused":
            print(f"  [{event.id}] RunPaused, asking: {[asked(r) for r in event.requirements or []]}")
        elif event.event == "RunRequirementDecided" and event.requirement is not None:
            decision = event.requirement.decision
            print(
                f"  [{event.id}] RunRequirementDecided by {event.requirement.decided_by}: {decision and decision.kind}"
            )
        elif event.event in ("RunContinued", "RunCompleted"):
            print(f"  [{event.id}] {event.event}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--approve"]:
        approve(*sys.argv[2:5])
    else:
        from workers.cli.demo import demo_environment

        with demo_environment(SCRIPT):
            main()
