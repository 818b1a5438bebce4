"""A project of one's own whose agents run on Ratchet's compose stack (../compose.yaml)."""
