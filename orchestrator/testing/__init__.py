"""Test doubles: a scripted, OpenAI-compatible model (pure logic in `script`, HTTP in `server`)."""
