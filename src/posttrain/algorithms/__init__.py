"""Losses and advantages as pure functions on tensors: no Ray, no I/O, no globals.

One small module per algorithm (grpo, dr_grpo, dapo, rloo, reinforce_pp, ppo, dpo; distill for opd); each name's
defaults are plain data in config/algorithm_presets.py (the config fills them before validation); advantages.py
dispatches the loop's advantage step."""
