"""Inner pytest runs forked from a server process that imported torch once.

A pytest subprocess on a 2-core machine spends 3-4 s importing torch and the ``torch._dynamo`` that torch's
profiler and dispatch-mode traces pull in, before its first test; the speed-gate, user-benchmark and workload
tests start dozens of such runs. :func:`run_forked` hands a run to a server (``python tests/forked_pytest.py``)
that imported those modules once and forks one child per run: a new process (its own pid, environment, working
folder, standard streams and process group) that runs ``pytest.main(args)`` and exits with its status, exactly
as ``python -m pytest args`` would, without the imports.

What differs from a subprocess, and so who may use it: the modules in :data:`PRELOAD` are imported before the
run's environment is set, so an inner run must not depend on environment variables read when they are
imported, nor on their absence from ``sys.modules`` (the side-effect tests, which check what a project that does
not use the plugin imports, keep real subprocesses). The objects those imports made are frozen out of the
garbage collector (``gc.freeze``): a run's collections walk only what the run made, and never free them. The
plugin itself is imported by each child, as in a subprocess. ``PYTEST_LSTMPERF_TEST_FORK=0`` turns forking off
(every run a subprocess); a machine without ``os.fork`` never forks.

A recording or compare of an inner run starts further pytest processes (``hooks/recording.py``): the server
forks those too. An inner run forked from it gets ``PYTEST_LSTMPERF_PROCESS_COMMAND`` naming
``tests/fork_client.py``, which hands its arguments, folder and environment to the server over a socket and exits
with the forked run's status. These tests check what the plugin does with its processes' figures, not how far a
machine's processes lie apart (the rule's own tests and the gate trials measure that).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

#: imported once by the server, before any run: what every inner run of these tests imports first
PRELOAD = ("numpy", "torch", "torch._dynamo", "torch.profiler", "scipy.stats", "pytest", "_pytest.pytester",
           "pytest_benchmark.plugin", "hypothesis")  # fmt: skip
#: hypothesis's distribution is a pytest plugin's: pytest would rewrite its modules, and warns in a run that finds
#: them imported already. Imported by the server (0.4 s of a 0.9 s trivial run on a 2-core machine, in every one
#: of about 150 runs), they are not rewritten in a child, as in a subprocess that imports them late: the
#: warning says nothing of the run, and each child ignores it (appended, so it wins over a run's own ``-W``)
PRELOAD_WARNINGS = tuple(
    f"-Wignore:Module already imported so cannot be rewritten; {name}:pytest.PytestAssertRewriteWarning"
    for name in ("hypothesis", "_hypothesis_globals")
)
ENABLED = hasattr(os, "fork") and os.environ.get("PYTEST_LSTMPERF_TEST_FORK", "1") != "0"
#: the server's socket, for the further processes an inner run starts (tests/fork_client.py reads it)
SOCKET_ENV = "PYTEST_LSTMPERF_TEST_FORK_SOCKET"
CLIENT = str(Path(__file__).with_name("fork_client.py"))


# ------------------------------------------------------------------------------------------------ server
def _serve() -> int:  # pragma: no cover - runs in the server process
    import gc
    import importlib
    import socket
    import threading

    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray output of the imports goes to the server's log, never into the replies
    for name in PRELOAD:
        with contextlib.suppress(Exception):  # a missing module is imported (and reported) by the run needing it
            importlib.import_module(name)
    # every object imported so far moves to the permanent generation: a child's garbage collections then
    # walk only what its run made. Else each run paid for walking torch's heap, most of all in pytest's own
    # gc.collect() passes at unconfigure (about 0.3 s of a 0.75 s collect-only run on a 2-core machine)
    gc.collect()
    gc.freeze()
    own_pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path[1:] if p not in own_pythonpath]
    # the further processes of the runs' recordings and compares ask over this socket (tests/fork_client.py)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.environ[SOCKET_ENV])
    listener.listen(16)
    # a fork copies one thread: with another one running (a thread pool started by an import) a child could
    # inherit a held lock; the client then runs subprocesses instead
    replies.write(json.dumps({"ready": threading.active_count() == 1, "threads": threading.active_count()}) + "\n")
    waiting: dict[int, socket.socket | None] = {}  # a running child -> who asked for it (None: the test process)

    def fork(request: dict) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            listener.close()
            for asker in waiting.values():
                if asker is not None:
                    asker.close()
            _child(request, base_path)
        return pid

    stdin_open = True
    while stdin_open or waiting:
        while waiting:  # the children that ended, each one's status to who asked for it
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            asker = waiting.pop(pid, None)
            reply = json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n"
            if asker is None:
                replies.write(reply)
            else:
                with contextlib.suppress(OSError):
                    asker.sendall(reply.encode())
                asker.close()
        readable, _, _ = select.select([sys.stdin, listener] if stdin_open else [listener], [], [], 0.05)
        if sys.stdin in readable:
            line = sys.stdin.readline()  # one request at a time: the test process waits for its run's status
            if not line:
                stdin_open = False
            else:
                pid = fork(json.loads(line))
                waiting[pid] = None
                replies.write(json.dumps({"pid": pid}) + "\n")
        if listener in readable:
            asker, _ = listener.accept()
            with asker.makefile("r") as stream:
                request = json.loads(stream.readline())
            waiting[fork(request)] = asker
    return 0


def _child(request: dict, base_path: list[str]) -> None:  # pragma: no cover - runs in a forked child
    import atexit
    import traceback

    code = 3
    try:
        os.setpgid(0, 0)  # its own process group: a timeout kills the run and what it started
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        pythonpath = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [request["cwd"], *pythonpath, *base_path]  # as `python -m pytest` in that folder
        sys.argv = [sys.executable, *request["args"]]
        code = int(pytest.main([*request["args"], *PRELOAD_WARNINGS]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


# ------------------------------------------------------------------------------------------------ client
class ForkServer:
    """The test session's server (started on first use, one per pytest-xdist worker)."""

    def __init__(self) -> None:
        import tempfile

        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
        self.folder = tempfile.mkdtemp(prefix="lstmperf-fork-")
        self.socket = os.path.join(self.folder, "server")
        env[SOCKET_ENV] = self.socket
        self.log = open(os.devnull, "w")  # noqa: SIM115 - the server's own stderr, for its lifetime
        self.process = subprocess.Popen(
            [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            env=env, text=True, bufsize=1,
        )  # fmt: skip
        hello = self._reply(120)
        self.usable = bool(hello and hello.get("ready"))

    def _reply(self, timeout: float | None) -> dict | None:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.process.stdout.readline()
        return json.loads(line) if line else None

    def run(self, args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> pytest.RunResult:
        out, err = cwd / "stdout", cwd / "stderr"
        from pytest_lstmperf.hooks.recording import COMMAND_ENV  # not at the top: the server never imports the plugin

        # the run's further processes (a recording's, a compare's) are forked by this server too
        env = {**env, SOCKET_ENV: self.socket, COMMAND_ENV: f"{sys.executable} {CLIENT}"}
        request = {"args": list(args), "cwd": str(cwd), "env": env, "stdout": str(out), "stderr": str(err)}
        assert self.process.stdin is not None
        start = time.perf_counter()
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        started = self._reply(60)
        if started is None:
            raise RuntimeError("the pytest fork server did not start the run")
        done = self._reply(timeout)
        if done is None:
            os.killpg(started["pid"], signal.SIGKILL)
            self._reply(30)
            pytest.fail(f"inner pytest run timed out after {timeout} s: pytest {' '.join(args)}", pytrace=False)
        duration = time.perf_counter() - start
        lines = out.read_text(errors="replace").splitlines(), err.read_text(errors="replace").splitlines()
        return pytest.RunResult(done["status"], *lines, duration)

    def close(self) -> None:
        import shutil

        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


_SERVER: list[ForkServer] = []


def server() -> ForkServer | None:
    """The session's fork server, or None where forking is off or unsafe (runs are subprocesses then)."""
    if not ENABLED:
        return None
    if not _SERVER:
        _SERVER.append(ForkServer())
    return _SERVER[0] if _SERVER[0].usable else None


def close_server() -> None:
    while _SERVER:
        _SERVER.pop().close()


def run_forked(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> pytest.RunResult | None:
    """``python -m pytest args`` in ``cwd`` with ``env``, forked from the server; None when forking is off."""
    forks = server()
    return None if forks is None else forks.run(args, cwd, env, timeout)


def runpytest_forked(pytester: pytest.Pytester, *args: str, timeout: float = 300) -> pytest.RunResult:
    """``pytester.runpytest_subprocess(*args, timeout=timeout)``, forked from the server where it can be."""
    from _pytest.pathlib import make_numbered_dir

    basetemp = make_numbered_dir(root=pytester.path, prefix="runpytest-", mode=0o700)
    full = [f"--basetemp={basetemp}", *args]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pytester.path), env.get("PYTHONPATH", "")]))
    result = run_forked(full, pytester.path, env, timeout)
    return result if result is not None else pytester.runpytest_subprocess(*args, timeout=timeout)


if __name__ == "__main__":
    sys.exit(_serve())
