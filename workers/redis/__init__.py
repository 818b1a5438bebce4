"""The Redis adapters of the domain's ports: the delta sink, the final channel and the limiter."""
