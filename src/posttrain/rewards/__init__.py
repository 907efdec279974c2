"""Reward sources: verifiable reward functions (built-in tasks), later reward models and judges."""
