"""posttrain: RL post-training of language models on Ray, with vLLM rollout."""

__version__ = "0.1.0"
