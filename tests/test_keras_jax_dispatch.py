"""A CPU run fixes every framework's threads; the Keras-on-JAX worker also runs JAX's CPU calls inline, not handed
to a dispatch thread (``server.one_thread_dispatch``): beside a busy process that thread moved the call and the
anchor apart on the 2-core VM. A GPU run, which fixes no CPU threads, leaves JAX's dispatch as it is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys
from pytest_lstmperf.paths.keras import server
sys.modules.setdefault("sklearn", None)
if server.cpu_threads() is not None:  # as serve() decides before the worker's imports
    server.one_thread_dispatch()
import jax
from jax._src import xla_bridge
print(xla_bridge._CPU_ENABLE_ASYNC_DISPATCH.value, len(jax.devices("cpu")))
"""


@pytest.mark.parametrize(("threads", "expected"), [("1", "False"), ("", "True")])
def test_a_cpu_run_dispatches_jax_calls_inline(threads: str, expected: str) -> None:
    pytest.importorskip("jax")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if threads:
        env["OMP_NUM_THREADS"] = threads
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2] == expected, done.stdout
