"""Everything Celery: the app and its settings, the tasks and their failure handlers, the
sweeper's beat task, the embedded worker and the `ratchet` command line. Thin: each task loads a
run, calls `orchestrator.steps.StepRunner`, and lets the database decide."""
