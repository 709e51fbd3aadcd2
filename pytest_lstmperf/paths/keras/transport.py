"""The pipe between the test process and a Keras worker: length-prefixed pickles, and the errors a worker reports.

One message is an 8-byte little-endian length followed by a pickle; requests are ``{"cmd": ..., "args": {...}}``,
replies ``{"ok": True, "result": ...}`` or ``{"ok": False, "error": ..., "kind": ..., "traceback": ...}``.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any


class KerasUnavailable(RuntimeError):
    """Keras or its backend cannot be imported in a worker; the message says what is missing."""


class KerasWorkerError(RuntimeError):
    """The worker raised while running a request; the message carries its error and traceback tail."""


def send(stream: Any, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


def recv(stream: Any) -> Any:
    header = stream.read(8)
    if len(header) < 8:
        raise EOFError("worker pipe closed")
    (size,) = struct.unpack("<Q", header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("worker pipe closed mid-message")
    return pickle.loads(data)
