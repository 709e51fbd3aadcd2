"""A CPU run fixes every framework's threads; the Keras-on-JAX worker also runs JAX's CPU calls inline, not handed
to a dispatch thread (``server.one_thread_dispatch``): beside a busy process that thread moved the call and the
anchor apart on the 2-core VM. A GPU run, which fixes no CPU threads, leaves JAX's dispatch as it is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_lstmperf.paths.keras import server

ROOT = Path(__file__).resolve().parents[1]


def report_dispatch(_: str) -> None:
    """The worker hook of the test below (``server.WORKER_HOOK_ENV``): how JAX's CPU client, made by then, was
    set up. The worker's stdout carries its protocol; a print reaches its stderr."""
    from jax._src import xla_bridge

    print(f"async dispatch: {xla_bridge._CPU_ENABLE_ASYNC_DISPATCH.value}", file=sys.stderr, flush=True)


@pytest.mark.parametrize(("threads", "expected"), [("1", "False"), ("", "True")])
def test_a_cpu_runs_keras_on_jax_worker_dispatches_jax_calls_inline(threads: str, expected: str) -> None:
    """The worker itself, started as the plugin starts it: ``OMP_NUM_THREADS`` is what a CPU run's
    ``device.apply_threads`` sets (``device.cpu_threads``). Planted: without the call in ``server.serve``, or
    with ``one_thread_dispatch`` setting nothing, the CPU case reads ``True``."""
    pytest.importorskip("jax")
    pytest.importorskip("keras")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if threads:
        env["OMP_NUM_THREADS"] = threads
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    env["KERAS_BACKEND"] = "jax"
    env["JAX_PLATFORMS"] = "cpu"
    env[server.WORKER_HOOK_ENV] = f"{Path(__file__).stem}:report_dispatch"
    done = subprocess.run([sys.executable, "-m", "pytest_lstmperf.paths.keras.server", "jax"],
                          stdin=subprocess.DEVNULL, env=env, capture_output=True, timeout=300)  # fmt: skip
    log = done.stderr.decode(errors="replace")
    assert done.returncode == 0, log[-2000:]
    assert f"async dispatch: {expected}" in log, log[-2000:]
