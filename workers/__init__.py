"""The adapters and the programs, by family: Celery (`celery/`: the app and its settings, the
tasks and their failure handler, the dispatcher, the broker transports, beat, the embedded worker,
the worker program with its sweeper), the Redis adapters of the ports (`redis/`: the delta sink,
the finals channel, the limiter), the `ratchet` command line (`cli/`), the HTTP API and the run
pages (`api/`), the Prometheus metrics (`prometheus.py`) and `ratchet health` (`health.py`). Thin:
each task loads a run, calls `orchestrator.steps.StepRunner`, and lets the database decide."""
