"""A producer: enqueues runs of the agents in agents.py and waits for a worker to finish them."""

from orchestrator import Client

from agents import team

out = team.run("hello", session_id="sess-A", timeout=60)  # enqueue and wait; or: await team.arun(...)
print(out.status, out.run_id)  # COMPLETED, and the run's id
for m in out.messages:  # system, user, assistant (calls broken_tool), tool (its error), assistant
    print(f"  {m.role}: {m.content or ', '.join(c.name for c in m.calls)}")

again = team.continue_run(out.run_id, timeout=60)  # a COMPLETED run forks: a new run_id
print(again.status, again.run_id, "forked from", again.forked_from)

handle = team.start("hello again", session_id="sess-A")  # enqueue only -> RunHandle
print(handle.wait(timeout=60).status)

session = Client().get_session("sess-A")  # read back from the database, no agent code needed
print(len(session.runs), "runs in sess-A")
