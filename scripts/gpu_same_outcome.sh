#!/usr/bin/env bash
# The default command on two trees of the project, one after the other on one GPU, and their per-test outcomes
# compared (scripts/compare_outcomes.py). From the repository root of the AFTER tree:
#   BEFORE=../other-tree OUT=dir bash scripts/gpu_same_outcome.sh
# Each tree runs its own plugin against its own committed baselines. OUT gets each run's log and JUnit XML, and
# compare.txt. Exit status: that of the comparison.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/same-outcome-out}
BEFORE=$(cd "${BEFORE:?BEFORE names the tree to compare against}" && pwd)
mkdir -p "$OUT"
AFTER=$PWD
for side in before after; do
  tree=$AFTER
  [ "$side" = before ] && tree=$BEFORE
  t0=$(date +%s)
  (cd "$tree" && source scripts/gpu_env.sh && timeout ${RUN_S:-280} "$PYTHON" -m pytest $PLUGIN suites/ --device=cuda \
    --benchmark-compare -p no:cacheprovider -rfEx --junitxml="$OUT/$side.xml" >"$OUT/$side.log" 2>&1)
  echo "$side: exit $?, $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/$side.log")"
  grep -h "^lstmperf gate\|speed gate" "$OUT/$side.log" | head -3
done
python3 scripts/compare_outcomes.py "$OUT/before.xml" "$OUT/after.xml" | tee "$OUT/compare.txt"
exit "${PIPESTATUS[0]}"
