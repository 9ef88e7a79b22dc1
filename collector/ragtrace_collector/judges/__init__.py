"""Judges: the LLM judge (litellm) and the deterministic offline judge."""
