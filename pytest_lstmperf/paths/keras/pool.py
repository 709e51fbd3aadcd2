"""The test process's side of the Keras workers: one persistent worker process per Keras backend.

Keras fixes its backend when first imported (``KERAS_BACKEND``), so the torch backend cannot share the test
process with the TensorFlow backend, and the test process (which imports torch for the PyTorch paths) must not
have TensorFlow's import order imposed on it. :func:`get_worker` starts ``python -m
pytest_lstmperf.paths.keras.server <backend>`` once per backend and session and talks to it over its stdin/stdout
pipes (:mod:`.transport`); the worker keeps the prepared layers by handle, so one prepare + many
run/forward/train_step calls cost one round trip each (tens of microseconds, reported in the timing notes). The
worker writes its logs to a temporary file, whose tail is shown when it fails.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from .transport import KerasUnavailable, KerasWorkerError, Request, WorkerInfo, recv_reply, send


class WorkerClient:
    """A persistent worker process for one Keras backend."""

    def __init__(self, backend: str, startup_timeout: float = 120.0) -> None:
        """Start the worker; :meth:`handshake` waits for it to be ready."""
        self.backend = backend
        self.lock = threading.Lock()
        self.pending_release: list[int] = []
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open for the worker's lifetime
            prefix=f"lstmperf-keras-{backend}-", suffix=".log", delete=False
        )
        env = dict(os.environ)
        env["KERAS_BACKEND"] = backend
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        # JAX would take 75% of the GPU at start; the torch paths of the same session share that GPU
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        if backend == "jax":
            env.update(xla_cache_env(env))
        root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pytest_lstmperf.paths.keras.server", backend],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
        )
        self.info: WorkerInfo | None = None
        self.exit_asked = False

    def handshake(self) -> WorkerInfo:
        """Wait for the worker's hello (sent once its imports are done); its info, or KerasUnavailable."""
        if self.info is None:
            try:
                hello = recv_reply(self.process.stdout)
            except EOFError:
                raise KerasUnavailable(f"Keras worker ({self.backend}) exited at start: {self.log_tail()}") from None
            if not hello.ok:
                self.close()
                raise KerasUnavailable(f"Keras on the {self.backend} backend cannot start: {hello.error}")
            if not isinstance(hello.result, WorkerInfo):
                self.close()
                raise KerasUnavailable(
                    f"Keras worker ({self.backend}) said hello with {type(hello.result).__name__}, not its WorkerInfo "
                    "(a worker of another version of pytest-lstmperf?)"
                )
            self.info = hello.result
        return self.info

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return Path(self.log.name).read_text(errors="replace")[-chars:].strip() or "(no output)"
        except OSError:
            return "(log unreadable)"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def defer_release(self, handle: int) -> None:
        self.pending_release.append(handle)  # list.append is atomic; sent with the next request

    def request(self, cmd: str, **args: Any) -> Any:
        with self.lock:
            if self.pending_release and self.alive:
                handles, self.pending_release[:] = list(self.pending_release), []
                send(self.process.stdin, Request("release", {"handles": handles}))
                recv_reply(self.process.stdout)
            if not self.alive or self.exit_asked:
                why = "was told to exit" if self.alive else "is not running"
                raise KerasWorkerError(f"Keras worker ({self.backend}) {why}: {self.log_tail()}")
            try:
                send(self.process.stdin, Request(cmd, args))
                reply = recv_reply(self.process.stdout)
            except (EOFError, BrokenPipeError, OSError):
                raise KerasWorkerError(
                    f"Keras worker ({self.backend}) died during {cmd!r} (exit {self.process.poll()}): {self.log_tail()}"
                ) from None
        if not reply.ok:
            detail = reply.traceback
            raise KerasWorkerError(reply.error + (f"\n--- worker traceback ---\n{detail}" if detail else ""))
        return reply.result

    def ask_to_exit(self) -> None:
        """Tell the worker to exit, without waiting for it (:meth:`close` waits)."""
        if self.process.poll() is None and not self.exit_asked:
            try:
                with self.lock:
                    send(self.process.stdin, Request("exit"))
                self.exit_asked = True
            except (OSError, EOFError):
                pass

    def close(self) -> None:
        if self.process.poll() is None:
            self.ask_to_exit()
            try:
                if not self.exit_asked:
                    raise OSError("the worker could not be told to exit")
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(timeout=10)
        try:
            self.log.close()
            os.unlink(self.log.name)
        except OSError:
            pass


#: the folder of the JAX worker's persistent compilation cache (None: off); :func:`set_xla_cache` sets it
_XLA_CACHE: list[str | None] = [None]


def resolve_xla_cache(value: str) -> str | None:
    """The folder for ``--lstmperf-xla-cache``: ``auto`` is ``pytest-lstmperf/xla`` in the user's cache folder
    (``$XDG_CACHE_HOME``, else ``~/.cache``), ``off`` is None, anything else is that folder."""
    if value == "off":
        return None
    if value == "auto":
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "pytest-lstmperf", "xla")
    return os.path.abspath(os.path.expanduser(value))


def set_xla_cache(folder: str | None) -> None:
    """Workers started from now on keep their compiled XLA executables in ``folder`` (None: no cache)."""
    _XLA_CACHE[0] = folder


def xla_cache_env(env: dict[str, str]) -> dict[str, str]:
    """The variables that give a JAX worker with environment ``env`` the persistent compilation cache.

    XLA compiles every Keras-on-JAX layer anew for each shape (seconds per executable on a GPU); with the cache a
    second run loads the executables it compiled before (key: the program, the jax/jaxlib version, the XLA
    flags and the device), so what runs and is observed is the same executable. Every executable is kept
    (JAX's defaults keep only compiles over 1 s). A cache the environment already names is left as it is."""
    folder = _XLA_CACHE[0]
    if folder is None or env.get("JAX_COMPILATION_CACHE_DIR"):
        return {}
    return {
        "JAX_COMPILATION_CACHE_DIR": folder,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }


def xla_cache_description() -> str:
    """One line for the run's header: where the JAX worker's executables are cached, and how many are."""
    folder = os.environ.get("JAX_COMPILATION_CACHE_DIR") or _XLA_CACHE[0]
    if folder is None:
        return "off (every executable compiled afresh)"
    source = " (JAX_COMPILATION_CACHE_DIR)" if os.environ.get("JAX_COMPILATION_CACHE_DIR") else ""
    unusable = _unwritable(folder)
    try:
        entries = [e for e in os.scandir(folder) if e.is_file()]
    except OSError:
        return f"{folder}{source} ({unusable or 'empty'})"
    size = sum(e.stat().st_size for e in entries) / 2**20
    held = f"{len(entries)} entries, {size:.0f} MiB"
    return f"{folder}{source} ({held}; {unusable})" if unusable else f"{folder}{source} ({held})"


def _unwritable(folder: str) -> str | None:
    """Why JAX cannot write executables into ``folder`` (created when missing), or None when it can: JAX
    then compiles afresh and keeps nothing, without a word, so the header says it."""
    probe = folder
    while not os.path.isdir(probe):
        parent = os.path.dirname(probe)
        if parent == probe or (os.path.exists(probe) and not os.path.isdir(probe)):
            return f"cannot be used: {probe} is not a folder; every executable is compiled afresh and none is kept"
        probe = parent
    if not os.access(probe, os.W_OK | os.X_OK):
        what = "not writable" if probe == folder else f"cannot be created ({probe} is not writable)"
        return f"{what}: every executable is compiled afresh and none is kept"
    return None


_WORKERS: dict[str, WorkerClient] = {}
_STARTING: dict[str, WorkerClient] = {}  # started by prestart(), hello not read yet
_FAILED: dict[str, str] = {}
_POOL_LOCK = threading.Lock()


def prestart(backends: list[str]) -> None:
    """Start the workers for ``backends`` now without waiting for them: each worker's imports (Keras, its
    backend, the GPU runtime: seconds each) then run beside the others' and beside the test process's own
    start-up, instead of one after another. :func:`get_worker` waits for the hello."""
    with _POOL_LOCK:
        for backend in dict.fromkeys(backends):
            running = _WORKERS.get(backend)
            if backend in _FAILED or backend in _STARTING or (running is not None and running.alive):
                continue
            try:
                _STARTING[backend] = WorkerClient(backend)
            except OSError:
                continue  # get_worker starts it again and reports what fails


def start_workers(backends: list[str]) -> None:
    """Start the workers for ``backends`` side by side and wait until each is ready or has failed (a path of
    that backend then reports why when it is used): for a test that needs several backends in a row and must
    not time one worker's calls beside another's imports."""
    prestart(backends)
    for backend in dict.fromkeys(backends):
        try:
            get_worker(backend)
        except KerasUnavailable:
            continue


def wait_started() -> None:
    """Wait until every worker :func:`prestart` started is ready or has failed: a benchmark's timing does not run
    beside a worker's start-up (its imports and its GPU runtime's start)."""
    with _POOL_LOCK:
        starting = list(_STARTING)
    for backend in starting:
        try:
            get_worker(backend)
        except KerasUnavailable:
            continue


def get_worker(backend: str) -> WorkerClient:
    """The session's worker for ``backend``, started on first use (and restarted if it died)."""
    with _POOL_LOCK:
        if backend in _FAILED:
            raise KerasUnavailable(_FAILED[backend])
        worker = _WORKERS.get(backend)
        if worker is None or not worker.alive:
            worker = _STARTING.pop(backend, None) or WorkerClient(backend)
            try:
                worker.handshake()
            except KerasUnavailable as exc:
                _FAILED[backend] = str(exc)
                raise
            _WORKERS[backend] = worker
        return worker


def shutdown_workers() -> None:
    """Close every worker: all are told to exit first, so that their teardowns (a GPU runtime's take about a
    second) run side by side."""
    with _POOL_LOCK:
        workers = [*_WORKERS.values(), *_STARTING.values()]
        for worker in workers:
            worker.ask_to_exit()
        for worker in workers:
            worker.close()
        _WORKERS.clear()
        _STARTING.clear()


atexit.register(shutdown_workers)
