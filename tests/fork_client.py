"""``python -m pytest ARGS`` as a further process of an inner run, forked by the test session's server.

    PYTEST_LSTMPERF_PROCESS_COMMAND="python tests/fork_client.py"   # set by tests/forked_pytest.py

Hands its arguments, working folder, environment and standard streams to the server whose socket
``PYTEST_LSTMPERF_TEST_FORK_SOCKET`` names, waits for the forked run, and exits with its status. Imports the
standard library only: it starts in a few tens of milliseconds, where ``python -m pytest`` spends seconds
importing torch.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def main(args: list[str]) -> int:
    pid = os.getpid()
    request = {
        "args": args,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "stdout": f"/proc/{pid}/fd/1",  # the forked run writes where this process's streams go
        "stderr": f"/proc/{pid}/fd/2",
    }
    sys.stdout.flush()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.connect(os.environ["PYTEST_LSTMPERF_TEST_FORK_SOCKET"])
        server.sendall((json.dumps(request) + "\n").encode())
        with server.makefile("r") as replies:
            line = replies.readline()
    if not line:
        print("fork_client: the test session's fork server closed the connection", file=sys.stderr)
        return 3
    return int(json.loads(line)["status"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
