#!/usr/bin/env bash
# The custom-task example in one command, from the repository root: bash examples/custom-task/run.sh
# data -> a tiny Llama-style model with a BPE tokenizer -> SFT warm start -> GRPO on your reward functions ->
# `posttrain eval --from-run` (the same functions score held-out) -> `posttrain compare` (SFT start vs RL result).
set -euo pipefail
P=${POSTTRAIN:-.venv/bin/posttrain}
CFG=examples/custom-task/config.yaml
OUT=runs/custom-task-eval
rm -rf runs/custom-task runs/custom-task-sft "$OUT"

$P model tiny runs/custom-task-base --arch llama --bpe 1000 --texts examples/custom-task/data/train.jsonl --max-len 256
$P sft "$CFG" --base runs/custom-task-base --out runs/custom-task-sft
$P train "$CFG"
FINAL=$(ls -d runs/custom-task/checkpoints/step_* | tail -1)/model
$P eval --model runs/custom-task-sft --from-run runs/custom-task --out "$OUT/sft"
$P eval --model "$FINAL" --from-run runs/custom-task --out "$OUT/final"
# exit 1 here would mean the RL result is significantly worse than its SFT start on the run's own reward
$P compare runs/custom-task-sft "$FINAL" --from-run runs/custom-task --out "$OUT/compare"
