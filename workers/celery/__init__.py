"""The Celery side: the app and its settings, the tasks, the dispatcher, the broker transports,
beat, the embedded worker and the task events."""
