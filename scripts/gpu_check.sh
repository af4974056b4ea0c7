#!/usr/bin/env bash
# The GPU check (issue 44): on one GPU machine without model weights or network, in at most 8 minutes,
#   (a) the GPU tests, `pytest -m gpu` (tests/test_gpu.py: CUDA against the CPU, token for token);
#   (b) the tiny loop (stage=loop, the tests' tiny settings) on the GPU twice: the second run must reuse every
#       artifact (no meta.json rewritten, the runner saying "reusing it");
#   (c) the sampling table of the issue: random-weight policies of SmolLM2-135M's shape (float32 at 128 and 512
#       rows, bfloat16 at 512) and of a 1.5B Llama (bfloat16, 512 rows), HF generate against rsft's plain sampler
#       (a replayed CUDA graph a step, sample.cuda_graphs=auto) and its packed step (cuda_graphs=off), 128 new
#       tokens, T=0.7, each as a share of the card's decode ceiling; the set-acceptance (oracle) draft at a=0.8,
#       gamma 3 on the 1.5B shape; and the packed step's cost outside the policy forward;
#   (s) speculation where a step is far from the card's compute: the oracle draft (a = 0.5, 0.7, 0.8, 0.9, gamma 3)
#       against plain sampling of the same peaked 1.5B policy at 64 and 128 rows, and the verification step's
#       kernel profile at 512 rows;
#   (t) the whole test suite but the real-model tests (`-m "not slow"`: no weights travel), on the GPU machine,
#       over pytest-xdist when it is there (tests/test_gpu.py among them).
#
#   bash scripts/gpu_check.sh                       (from anywhere; it runs in the repository root)
#   WHEELS=shared/wheels bash scripts/gpu_check.sh  (the default: the wheels scripts/gpu_wheels.sh fetched)
#
# Settings (environment): WHEELS (wheel folder, for the packages the machine lacks: trl, datasets, hydra-core,
# ...; installed with pip --no-deps --target $DEPS, put on PYTHONPATH with the repository), DEPS, DEVICE
# (cuda), BUDGET (seconds for everything, 480), LOG (default runs/gpu_check/<time>.log, or $OUT/ when $OUT
# is set), QUICK=1 (tiny sizes: to try this script on a CPU, with DEVICE=cpu), PARTS (the parts to run, by the
# first word of their names, e.g. "a c1 c3 c5"; default all).
# Everything printed goes to stdout and the log; it ends with the tables, for docs/benchmarks.md (with the
# commit, the card and the date printed at the top). TESTS, DIST and T_LIMIT (part t: the tests to run, default the
# whole suite, pytest-xdist's --dist, default loadfile, and its seconds, default 300: 8 workers on an H200 did not
# finish the suite in 300 s on 2026-11-28, 14 workers with --dist load did in 290 s), WORKERS (pytest-xdist's
# workers, default half the cores) and T_ARGS (pytest's other options, default -q). C_METHODS (the methods of (c),
# "hf plain packed"). REPEATS (round-robin repeats of each bench, 3). Exit status 1 when a part failed or was skipped.
set -uo pipefail  # not -e: a part that fails is recorded, and the next one runs
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$PWD
STAMP=$(date -u +%Y%m%d-%H%M%S)
WHEELS=${WHEELS:-shared/wheels}
DEPS=${DEPS:-${TMPDIR:-/tmp}/rsft-gpu-deps}
DEVICE=${DEVICE:-cuda}
BUDGET=${BUDGET:-480}
QUICK=${QUICK:-0}
PARTS=${PARTS:-}
WORK=${WORK:-runs/gpu_check/$STAMP}
if [[ -n ${OUT:-} ]]; then LOG=${LOG:-$OUT/gpu_check_$STAMP.log}; else LOG=${LOG:-runs/gpu_check/$STAMP.log}; fi
mkdir -p "$WORK" "$(dirname "$LOG")"
exec > >(tee -a "$LOG") 2>&1
START=$SECONDS
FAILED=()
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no network there: fail at once, not after retries

# part NAME LIMIT_S COMMAND...: COMMAND under `timeout`, at most LIMIT_S and what is left of BUDGET; its output
# also in $WORK/<NAME>.log; a non-zero exit (124: timed out) or a skip is recorded in FAILED. A part whose name's
# first word (a, b, c1, ...) is not in PARTS (when set) does not run, and is not a failure.
part() {
  local name=$1 limit=$2
  shift 2
  if [[ -n $PARTS && " $PARTS " != *" ${name%%-*} "* ]]; then
    echo -e "\n## $name: not asked for (PARTS=$PARTS)"
    return 2
  fi
  local left=$((BUDGET - (SECONDS - START) - 5))
  ((limit > left)) && limit=$left
  if ((limit < 15)); then
    echo -e "\n## $name: skipped (${left}s of the ${BUDGET}s budget left)"
    FAILED+=("$name (skipped: out of time)")
    return 1
  fi
  echo -e "\n## $name (timeout ${limit}s, at $((SECONDS - START))s)\n\$ $*"
  local begun=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$WORK/${name//[^A-Za-z0-9._-]/_}.log"
  rc=${PIPESTATUS[0]}
  echo "## $name: exit $rc after $((SECONDS - begun))s"
  if ((rc != 0)); then
    FAILED+=("$name (exit $rc$([[ $rc == 124 ]] && echo ', timed out'))")
    return 1
  fi
}

echo "# rsft GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
if [[ -n ${RSFT_COMMIT:-} ]]; then  # named by whoever copied the tree here (a copy's .git can be older than it)
  commit=$RSFT_COMMIT
elif commit=$(git rev-parse --short HEAD 2>/dev/null); then
  git diff --quiet HEAD 2>/dev/null || commit="$commit + uncommitted changes"
else
  commit="unknown (no .git here: set RSFT_COMMIT)"
fi
echo "commit: $commit"
CARD=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
echo "card: ${CARD:-none (no nvidia-smi)}; $(nproc --all) cores; python $(python -c 'import sys; print(sys.version.split()[0])')"
echo "device: $DEVICE, budget ${BUDGET}s, quick=$QUICK, log $LOG, work $WORK"

# --- the packages the machine lacks, from the wheel folder ------------------------------------------------------
missing=$(python - <<'EOF'
import importlib.util
wanted = {"trl": "trl", "datasets": "datasets", "dill": "dill", "multiprocess": "multiprocess", "xxhash": "xxhash",
          "hydra": "hydra_core", "omegaconf": "omegaconf", "antlr4": "antlr4_python3_runtime", "gguf": "gguf",
          "pytest_timeout": "pytest_timeout", "xdist": "pytest_xdist", "execnet": "execnet"}
print(" ".join(wheel for module, wheel in wanted.items() if importlib.util.find_spec(module) is None))
EOF
)
if [[ -n $missing ]]; then
  wheels=()
  for name in $missing; do
    found=$(ls "$WHEELS"/"$name"-*.whl 2>/dev/null | head -1)
    if [[ -z $found ]]; then
      echo "missing package $name and no $WHEELS/$name-*.whl: run scripts/gpu_wheels.sh on a machine with network"
      exit 1
    fi
    wheels+=("$found")
  done
  echo "installing into $DEPS: ${wheels[*]##*/}"
  python -m pip install --quiet --no-deps --no-index --upgrade --target "$DEPS" "${wheels[@]}" || exit 1
fi
export PYTHONPATH="$DEPS:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# datasets 5.2 needs huggingface_hub >= 1.31; an older one (transformers 5.17 admits 1.5 on) gets the fallback wheel
if ! python -c 'import huggingface_hub as h, sys; v = tuple(int(x) for x in h.__version__.split(".")[:2]); sys.exit(v < (1, 31))'; then
  hub=$(ls "$WHEELS"/fallback/huggingface_hub-*.whl 2>/dev/null | head -1)
  echo "huggingface_hub older than 1.31: installing ${hub:-nothing (no fallback wheel)}"
  [[ -n $hub ]] && python -m pip install --quiet --no-deps --no-index --upgrade --target "$DEPS" "$hub"
fi
python - <<EOF || exit 1
import torch, transformers, datasets, trl, hydra, omegaconf, huggingface_hub
print("torch", torch.__version__, "cuda", torch.version.cuda, "| transformers", transformers.__version__,
      "| datasets", datasets.__version__, "| trl", trl.__version__, "| hub", huggingface_hub.__version__,
      "| hydra", hydra.__version__)
if "$DEVICE".startswith("cuda"):
    assert torch.cuda.is_available(), "DEVICE=$DEVICE but torch.cuda.is_available() is False"
    print("cuda device:", torch.cuda.get_device_name(0))
EOF

# --- (a) the GPU tests -------------------------------------------------------------------------------------------
RSFT_GPU_TEST_DEVICE=$DEVICE part "a-pytest-gpu" 150 python -m pytest -m gpu tests/ -q -p no:cacheprovider -rs \
  --continue-on-collection-errors

# --- (b) the tiny loop twice: the second run reuses everything ----------------------------------------------------
LOOP=(stage=loop run_name=gpu_check_tiny "paths.runs_root=$WORK/runs" policy=tiny logger=none reward=tiny
      data.limit=3 data.eval_limit=2 data.rotate=false sample.num_samples=3 sample.max_new_tokens=8
      sample.batch_rows=16 loop.rounds=2 loop.refresh_reward=false prefs.num_prompts=4 prefs.num_samples=3
      prefs.max_new_tokens=8 eval.num_samples=2 select.drop_truncated=false sft.mode=full sft.learning_rate=1e-3
      "device=$DEVICE")
stamps() { find "$WORK/runs" -name meta.json -printf '%p %T@\n' 2>/dev/null | sort; }
if part "b-loop-first" 120 python -m rsft.run "${LOOP[@]}"; then
  before=$(stamps)
  if part "b-loop-second" 90 python -m rsft.run "${LOOP[@]}"; then
    after=$(stamps)
    reused=$(grep -c "reusing it" "$WORK/b-loop-second.log")
    artifacts=$(echo "$before" | grep -c meta.json)
    if [[ $before == "$after" && $artifacts -gt 0 && $reused -gt 0 ]]; then
      echo "## b: the second run reused all $artifacts artifacts (no meta.json rewritten; $reused 'reusing it' lines)"
    else
      echo "## b: the second run rebuilt something:"; diff <(echo "$before") <(echo "$after")
      FAILED+=("b-loop-reuse")
    fi
  fi
fi

# --- the benches' settings ------------------------------------------------------------------------------------------
# the decode ceiling's memory bandwidth: the card's (about 90% of its peak); the bench's defaults are an H200's
case "$CARD" in
  *H100*PCIe*) CEILING=(--bandwidth-gbs 1800) ;;
  *H100*) CEILING=(--bandwidth-gbs 3000) ;;
  *) CEILING=() ;;
esac
SMALL=smollm2-135m LARGE=llama-1.5b ROWS_SMALL=128 ROWS=512 PROMPTS_SMALL=16 PROMPTS=64 TOKENS=128 REPEATS=${REPEATS:-3}
ROWS_FEW=(64 128)
read -ra C_METHODS <<< "${C_METHODS:-hf plain packed}"  # (c)'s methods: packed is the step without the graph
if [[ $QUICK == 1 ]]; then  # the script itself, on a CPU: everything tiny (the 1.5B shape alone is 6 GB in float32)
  LARGE=smollm2-135m ROWS_SMALL=4 ROWS=8 PROMPTS_SMALL=1 PROMPTS=2 TOKENS=8 REPEATS=1 ROWS_FEW=(4 8)
fi
BENCH=(python scripts/bench_sampling.py --device "$DEVICE" --k 8 --max-new-tokens "$TOKENS" --temperature 0.7
       --repeats "$REPEATS" "${CEILING[@]}")
# --- (s) speculation at fewer rows: a = 0.5 .. 0.9, gamma 3, against plain sampling of the same peaked policy ------
part "s1-speculation-1.5b-few-rows" 150 "${BENCH[@]}" --prompts "$PROMPTS_SMALL" --policy-config "$LARGE" \
  --dtype bfloat16 --batch-rows "${ROWS_FEW[@]}" --methods oracle --acceptance 0.5 0.7 0.8 0.9 --gammas 3 --ceiling \
  --out "$WORK/s1.json"
part "s2-kernel-profile-verify-1.5b" 60 "${BENCH[@]}" --prompts "$PROMPTS" --policy-config "$LARGE" --dtype bfloat16 \
  --batch-rows "$ROWS" --max-new-tokens 16 --kernel-profile --methods oracle --acceptance 0.8 --gammas 3

# --- (t) the test suite on the GPU machine -------------------------------------------------------------------------
read -ra SUITE <<< "${TESTS:-tests/}"  # TESTS: some test files or ids instead of the whole suite
[[ $QUICK == 1 ]] && SUITE=(tests/test_gpu.py tests/sampling/test_graphed.py)
XDIST=()
if python -c 'import xdist' 2>/dev/null && [[ $QUICK != 1 ]]; then
  XDIST=(-n "${WORKERS:-$(( $(nproc) > 2 ? $(nproc) / 2 : 1 ))}" --dist "${DIST:-loadfile}")
fi
read -ra T_ARGS <<< "${T_ARGS:--q}"  # T_ARGS: pytest's verbosity and more (-v names each test as it ends)
OMP_NUM_THREADS=2 RSFT_GPU_TEST_DEVICE=$DEVICE part "t-suite" "${T_LIMIT:-300}" python -m pytest -m "not slow" \
  "${SUITE[@]}" "${T_ARGS[@]}" -p no:cacheprovider -rfEs "${XDIST[@]}"

# --- (c) the sampling table --------------------------------------------------------------------------------------
# 128 rows: 16 prompts x K=8, one wave of rows (the issue's table); 512 rows: 64 prompts x 8
part "c1-smollm2-float32-128" 90 "${BENCH[@]}" --prompts "$PROMPTS_SMALL" --policy-config "$SMALL" \
  --dtype float32 --batch-rows "$ROWS_SMALL" --methods "${C_METHODS[@]}" --ceiling --out "$WORK/c1a.json"
part "c1-smollm2-float32-512" 90 "${BENCH[@]}" --prompts "$PROMPTS" --policy-config "$SMALL" --dtype float32 \
  --batch-rows "$ROWS" --methods "${C_METHODS[@]}" --ceiling --out "$WORK/c1b.json"
part "c2-smollm2-bfloat16" 90 "${BENCH[@]}" --prompts "$PROMPTS" --policy-config "$SMALL" --dtype bfloat16 \
  --batch-rows "$ROWS" --methods "${C_METHODS[@]}" --ceiling --out "$WORK/c2.json"
part "c3-llama1.5b-bfloat16" 180 "${BENCH[@]}" --prompts "$PROMPTS" --policy-config "$LARGE" --dtype bfloat16 \
  --batch-rows "$ROWS" --methods "${C_METHODS[@]}" oracle --acceptance 0.8 --gammas 3 --ceiling --out "$WORK/c3.json"
part "c4-step-profile" 60 "${BENCH[@]}" --prompts "$PROMPTS" --policy-config "$SMALL" --dtype bfloat16 \
  --batch-rows "$ROWS" --step-profile
# where a graphed step's time goes: the kernels with the most device time, and device time against wall time
part "c5-kernel-profile-float32" 60 "${BENCH[@]}" --prompts "$PROMPTS" --policy-config "$SMALL" --dtype float32 \
  --batch-rows "$ROWS" --max-new-tokens 16 --kernel-profile
part "c5-kernel-profile-1.5b" 60 "${BENCH[@]}" --prompts "$PROMPTS" --policy-config "$LARGE" --dtype bfloat16 \
  --batch-rows "$ROWS" --max-new-tokens 16 --kernel-profile

# --- the tables, together, and the verdict -------------------------------------------------------------------------
echo -e "\n# Tables ($commit; ${CARD:-no card}; $(date -u +%Y-%m-%d))"
for name in c1-smollm2-float32-128 c1-smollm2-float32-512 c2-smollm2-bfloat16 c3-llama1.5b-bfloat16 c4-step-profile \
    c5-kernel-profile-float32 c5-kernel-profile-1.5b s1-speculation-1.5b-few-rows s2-kernel-profile-verify-1.5b; do
  [[ -f $WORK/$name.log ]] || continue
  echo -e "\n### $name"
  grep -E '^(\||Decode ceiling|- [0-9]+ rows|plain, |kernel profile)' "$WORK/$name.log"
done
if [[ -f $WORK/t-suite.log ]]; then
  echo -e "\n### t-suite"
  grep -E '^(FAILED|ERROR|SKIPPED)|[0-9]+ (passed|failed)' "$WORK/t-suite.log" | tail -40
fi
[[ -n ${OUT:-} ]] && cp "$WORK"/*.json "$OUT"/ 2>/dev/null
echo -e "\nGPU check done in $((SECONDS - START))s; log: $LOG"
if ((${#FAILED[@]})); then
  printf 'FAILED: %s\n' "${FAILED[@]}"
  exit 1
fi
echo "all parts passed"
