"""The pipe between the test process and a Keras worker: length-prefixed pickles, and the errors a worker reports.

One message is an 8-byte little-endian length followed by a pickle of a :class:`Request` (test process to worker)
or a :class:`Reply` (worker to test process): the two records of the pipe, written and read here alone.
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Request:
    """A call of the worker's ``cmd`` method with ``args``; ``exit`` ends the worker."""

    cmd: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    """What the worker answers: its result, or the error it raised (its type's name and its traceback's tail)."""

    ok: bool
    result: Any = None
    error: str = ""
    kind: str = ""
    traceback: str = ""

    @classmethod
    def failed(cls, exc: BaseException, traceback: str = "") -> Reply:
        return cls(False, error=f"{type(exc).__name__}: {exc}", kind=type(exc).__name__, traceback=traceback)


class KerasUnavailable(RuntimeError):
    """Keras or its backend cannot be imported in a worker; the message says what is missing."""


class KerasWorkerError(RuntimeError):
    """The worker raised while running a request; the message carries its error and traceback tail."""


def send(stream: Any, message: Request | Reply) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


def recv(stream: Any) -> Any:
    """The next message on ``stream`` (a :class:`Request` or a :class:`Reply`); EOFError where the pipe closed."""
    header = stream.read(8)
    if len(header) < 8:
        raise EOFError("worker pipe closed")
    (size,) = struct.unpack("<Q", header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("worker pipe closed mid-message")
    return pickle.loads(data)


def recv_request(stream: Any) -> Request:
    message = recv(stream)
    if not isinstance(message, Request):
        raise TypeError(f"not a request of the Keras worker's pipe: {type(message).__name__}")
    return message


def recv_reply(stream: Any) -> Reply:
    message = recv(stream)
    if not isinstance(message, Reply):
        raise TypeError(f"not a reply of the Keras worker's pipe: {type(message).__name__}")
    return message


class Narrowed:
    """A float64 array sent as float32 (see :func:`narrow`)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Any, ...]:
        return (Narrowed, (self.array,))


def narrow(value: Any) -> Any:
    """``value`` (arrays, ``None``, and dicts of them) with every float64 array whose values float32 holds
    exactly replaced by a float32 copy (:class:`Narrowed`): half the bytes through the pipe. A case's arrays
    hold values of the spec's dtype (``model.case``), float32 or narrower for every spec but a float64 one;
    the 1024-wide benchmark shapes sent 95 MB per prepared run. :func:`widen` restores the float64 array
    bit for bit; an array float32 cannot hold exactly is sent as it is."""
    if isinstance(value, dict):
        return {key: narrow(item) for key, item in value.items()}
    if isinstance(value, np.ndarray) and value.dtype == np.float64:
        single = value.astype(np.float32)
        if np.array_equal(single, value):
            return Narrowed(single)
    return value


def widen(value: Any) -> Any:
    """The inverse of :func:`narrow`."""
    if isinstance(value, dict):
        return {key: widen(item) for key, item in value.items()}
    if isinstance(value, Narrowed):
        return value.array.astype(np.float64)
    return value
