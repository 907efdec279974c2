"""Losses and advantages as pure functions on tensors: no Ray, no I/O, no globals."""
