"""Model directories: the built-in tiny-model factory and the loader for any local HF causal-LM directory."""
