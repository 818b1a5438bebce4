"""An extraction job: text in, a validated pydantic object out (`output_schema`, Agno's name).

The model is asked for the schema the provider's way (Chat Completions `response_format` with a
JSON schema; Responses `text.format`), and its reply is validated. A reply that does not follow
the schema is retried as a model error, with the validation error shown to the model, up to the
agent's `retries`; after that the run goes to ERROR with the reply kept on its row. The run's
`content` is the model instance for the agent's own `run()`; a run read back through `Client`
is the JSON as stored, which `content_as(SupportTicket)` turns back into the instance.

Run it with `make demo` (SQLite, a broker that needs no server, an in-process worker, and the
project's scripted model unless OPENAI_API_KEY is set: its first reply leaves a field out, so
you see the retry).
"""

from pydantic import BaseModel, Field

from orchestrator import Agent, Client
from orchestrator.models import OpenAIChat
from orchestrator.testing.script import ScriptConfig


class SupportTicket(BaseModel):
    customer: str = Field(description="The customer's full name")
    product: str = Field(description="The product the message is about")
    urgent: bool = Field(description="Whether the customer cannot work until it is fixed")
    summary: str = Field(description="The problem in one sentence")


agent = Agent(
    name="ticket-extractor",
    model=OpenAIChat(id="gpt-4o-mini"),
    instructions="Extract a support ticket from the customer's message.",
    output_schema=SupportTicket,
    retries=2,
)

EMAIL = (
    "Hello, this is Grace Hopper from Acme. Since this morning the Ratchet dashboard shows no runs "
    "at all and my whole team is blocked. Please help as soon as you can!"
)
#: What the scripted model answers when OPENAI_API_KEY is not set: first without `urgent`, then whole.
SCRIPT = ScriptConfig(
    final_replies=[
        '{"customer": "Grace Hopper", "product": "Ratchet dashboard", "summary": "The dashboard shows no runs."}',
        '{"customer": "Grace Hopper", "product": "Ratchet dashboard", "urgent": true, '
        '"summary": "The dashboard shows no runs and the team is blocked."}',
    ]
)


def main() -> None:
    out = agent.run(EMAIL, timeout=120)
    print(f"status: {out.status.value}")
    ticket = out.content
    assert isinstance(ticket, SupportTicket), ticket
    print(f"content is a {type(ticket).__name__}: {ticket!r}")
    retries = [e for e in Client().store.get_events(out.run_id) if e["kind"] == "retry"]
    for event in retries:
        error = event["detail"]["error"]
        print(f"retried after {error['type']}: {' '.join(error['message'].split())}")
    again = Client().get_run(out.run_id).content_as(SupportTicket)  # a producer that holds the schema
    tokens = out.metrics
    print(f"read back: {again == ticket}; tokens: {tokens.input_tokens} in, {tokens.output_tokens} out")


if __name__ == "__main__":
    from workers.cli.demo import demo_environment

    with demo_environment(SCRIPT):
        main()
