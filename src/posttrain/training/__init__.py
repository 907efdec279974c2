"""training."""
