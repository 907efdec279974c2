"""Reward sources: verifiers of the built-in tasks, your reward functions, reward models, an LLM judge, and their
composition."""
