"""A script (or a notebook) that runs its own worker, in this process, while it needs one."""

from workers.celery.embedded import EmbeddedWorker

from agents import team

with EmbeddedWorker():  # a Celery worker and the sweeper in threads of this process, stopped after the block
    out = team.run("hello", timeout=60)
print(out.status, out.content)
