#!/usr/bin/env bash
# The GPU jobs of examples/ci/lstmperf.yml (speed-gate, then update-baseline), their steps run as written on a
# CUDA machine, each in a fresh copy of this checkout (its files, tracked or not yet but not ignored), from the
# repository root:  OUT=/tmp/ci-gpu bash scripts/gpu_ci_recipe.sh   (JOBS=speed-gate: that job only)
#
# A runner downloads torch, JAX and Keras; a machine without network cannot. What differs from a runner, and only
# that: pip runs offline (PIP_NO_INDEX=1) from the carried wheels (PIP_FIND_LINKS: build/ci-wheels/ with
# setuptools, wheel, pytest-xdist, ruff, mypy and their dependencies, and .whl/ with Keras and its dependencies),
# and `python3 -m venv .venv` makes the environment with --system-site-packages (a python3 shim first on PATH),
# so the machine's CUDA builds of torch and JAX stand for the downloads: `pip install torch --index-url ...` and
# 'jax[cuda13]' find them installed. Everything else, the commands, the options, the folders and the committed
# baselines, is the recipe's. The update-baseline job writes into its copy, never into this checkout.
# Writes to $OUT: versions.txt, <job>.log (each step's output), junit-gate.xml, lstmperf-report/, the recorded
# baseline (update-baseline/*.json) and summary.md (what the jobs wrote to $GITHUB_STEP_SUMMARY).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$PWD/gpu-ci-recipe-out}
REAL_PYTHON=$(command -v python3)
WORK=${WORK:-/tmp/ci-gpu-recipe}
rm -rf "$WORK" && mkdir -p "$OUT" "$WORK/shim"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$ROOT/build/ci-wheels $ROOT/.whl" PIP_NO_CACHE_DIR=1
export GITHUB_STEP_SUMMARY="$OUT/summary.md" GITHUB_RUN_ID=local
cat > "$WORK/shim/python3" <<SHIM
#!/usr/bin/env bash
if [ "\${1:-}" = -m ] && [ "\${2:-}" = venv ]; then
  shift 2
  "$REAL_PYTHON" -m venv --system-site-packages "\$@" || exit \$?
  # where the machine's python is itself a virtual environment, --system-site-packages reaches its base
  # interpreter only: its own site-packages (CUDA torch, JAX) go on the new environment's path too
  dir="\${@: -1}"
  site=\$("\$dir/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  "$REAL_PYTHON" -c "import site, sysconfig; print('\\n'.join(dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()['purelib']])))" > "\$site/machine-site.pth"
  # pip finds pytest installed there and writes no .venv/bin/pytest, which a runner's fresh install would have
  printf '#!/bin/sh\\nexec "\$(dirname "\$0")/python" -m pytest "\$@"\\n' > "\$dir/bin/pytest" && chmod +x "\$dir/bin/pytest"
  exit 0
fi
exec "$REAL_PYTHON" "\$@"
SHIM
chmod +x "$WORK/shim/python3"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$REAL_PYTHON" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  "$REAL_PYTHON" -c "import jax; print('jax', jax.__version__, jax.default_backend())" 2>&1 | tail -1
  "$REAL_PYTHON" -m pip list 2>/dev/null | grep -i -E "^(jax|keras|pytest|nvidia-cudnn)" ; } | tee "$OUT/versions.txt"
status=0
for job in ${JOBS:-speed-gate update-baseline}; do
  copy="$WORK/$job"
  mkdir -p "$copy"
  if git rev-parse --git-dir >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
      [ -f "$f" ] && mkdir -p "$copy/$(dirname "$f")" && cp -p "$f" "$copy/$f"
    done
  else  # a copy of the working tree without .git: all of it but the carried and built folders
    tar --exclude=./build --exclude=./.whl --exclude=./.venv --exclude='./gpu-*-out' -cf - . | tar -xf - -C "$copy"
  fi
  "$REAL_PYTHON" tests/ci_recipe.py examples/ci/lstmperf.yml "$job" > "$WORK/$job.sh"
  # 'jax[cuda13]' pulls JAX's CUDA wheels (nvidia-cuda-nvcc, ...), which a machine without network cannot fetch:
  # there, and only there, the machine's installed CUDA JAX stands for it (said in the log)
  if [ -n "${OFFLINE_JAX:-1}" ] && grep -q "'jax\[cuda13\]'" "$WORK/$job.sh"; then
    sed -i "s/'jax\[cuda13\]'/jax/" "$WORK/$job.sh"
    echo "== $job: 'jax[cuda13]' read as jax (the machine's CUDA build; no network to fetch its CUDA wheels)" >> "$OUT/$job.log"
  fi
  echo "== $job (steps: $(grep -c '^# step:' "$WORK/$job.sh"))" | tee "$OUT/$job.log"
  # the job's steps, each a script: the workflow's env, then the step's command
  "$REAL_PYTHON" - "$WORK/$job.sh" "$WORK/$job" > "$WORK/$job.names" <<'PY'
import re, sys
head, *steps = re.split(r"^# step: (.*)$", open(sys.argv[1]).read(), flags=re.M)
for i in range(0, len(steps), 2):
    with open(f"{sys.argv[2]}.step{i // 2}.sh", "w") as f:
        f.write(head + steps[i + 1])
    print(steps[i])
PY
  n=0
  while IFS= read -r name; do
    start=$(date +%s)
    (cd "$copy" && PATH="$WORK/shim:$PATH" timeout 1500 bash --noprofile --norc -eo pipefail "$WORK/$job.step$n.sh") \
      >> "$OUT/$job.log" 2>&1
    rc=$?
    echo "== $job / $name: exit $rc in $(( $(date +%s) - start )) s" | tee -a "$OUT/$job.log"
    [ $rc -ne 0 ] && { status=1; break; }
    n=$((n + 1))
  done < "$WORK/$job.names"
  grep -E "^(lstmperf: device|speed gate|upgrade:)|passed|failed|error" "$OUT/$job.log" | cut -c1-240 | tail -12
done
cp -r "$WORK/speed-gate/junit-gate.xml" "$WORK/speed-gate/lstmperf-report" "$OUT/" 2>/dev/null
mkdir -p "$OUT/update-baseline" && cp "$WORK"/update-baseline/baselines/*.json "$OUT/update-baseline/" 2>/dev/null
echo "== summary: exit $status"
exit $status
