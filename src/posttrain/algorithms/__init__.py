"""Losses and advantages as pure functions on tensors: no Ray, no I/O, no globals.

One small module per algorithm (grpo, dr_grpo, dapo, rloo, reinforce_pp, ppo, dpo); presets.py names each
algorithm's defaults (no torch import, so config.py can use it); advantages.py dispatches the loop's advantage step."""
