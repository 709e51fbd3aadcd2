# Sourced by the GPU scripts, from the repository root (`source scripts/gpu_env.sh` after `cd` there):
#   * wheels carried in .whl/ (keras and its small dependencies: the device machine has no network) are installed
#     into /tmp/site, which goes on PYTHONPATH;
#   * this checkout goes first on PYTHONPATH, so its plugin is the one that runs, installed or not;
#   * PLUGIN holds the pytest arguments that load the plugin: "-p pytest_lstmperf.plugin", or nothing when an
#     installed distribution registers it through its pytest11 entry point (pytest loads it then, and a second
#     -p would register it twice). Pass it unquoted: `$PYTHON -m pytest $PLUGIN ...`.
#   * a Python that can neither find nor write torch's bytecode (a read-only environment, or
#     PYTHONDONTWRITEBYTECODE=1 as container images often set) compiles every module it imports on every run: on an
#     H200 machine 9 s of the default command's main process, torch._dynamo and sympy most of it; the Keras workers
#     import their frameworks the same way. Bytecode then goes to PYTHONPYCACHEPREFIX (a writable folder), so that a second run
#     finds it, as on a machine whose packages were compiled when installed.
# Sets PYTHON (default python3) and PYTHONUNBUFFERED=1 (logs written as they happen).
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if ! "$PYTHON" -c "import importlib.util as u, os, sys
d = os.path.dirname(u.find_spec('torch').origin)
c = os.path.join(d, '__pycache__')
sys.exit(0 if not sys.dont_write_bytecode and os.access(c if os.path.isdir(c) else d, os.W_OK) else 1)" 2>/dev/null; then
  unset PYTHONDONTWRITEBYTECODE
  export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-${TMPDIR:-/tmp}/lstmperf-pycache}
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PLUGIN="-p pytest_lstmperf.plugin"
if "$PYTHON" -c "import importlib.metadata as m, sys
sys.exit(0 if any(e.name == 'lstmperf' for e in m.entry_points(group='pytest11')) else 1)" 2>/dev/null; then
  PLUGIN=""
fi
