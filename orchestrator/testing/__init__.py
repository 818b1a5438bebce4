"""Test doubles for your own agents' tests, never loaded by `import orchestrator`.

- `script`: the pure logic of a scripted model (what to answer, which faults to raise), reading
  requests as a `conversation`;
- `model`: `ScriptedModel`, that script in-process, with no HTTP;
- `server`: `ScriptedServer`, that script as an OpenAI-compatible HTTP server, whose bodies
  `replies` builds from the openai package's own types;
- `waiting`: `wait_until`, a deadline instead of a sleep.
"""
