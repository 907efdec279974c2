"""`posttrain serve`: a Tinker-compatible training service (the `tinker` 0.38.0 SDK's wire) over posttrain's LoRA
trainer, losses and atomic checkpoints: the wire, a per-model seq_id queue, a futures store with a long poll."""
