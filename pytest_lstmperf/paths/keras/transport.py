"""The pipe between the test process and a Keras worker: length-prefixed pickles, the records they carry, and the
errors a worker reports.

One message is an 8-byte little-endian length followed by a pickle of a :class:`Request` (test process to worker)
or a :class:`Reply` (worker to test process): the two records of the pipe, written and read here alone. What a
reply's ``result`` holds is typed too: :class:`WorkerInfo` (the hello), a prepared run's handle, a
:class:`~pytest_lstmperf.paths.PathResult` (``run``), a :class:`GraphProbe`, :class:`JaxAttempt` rows, a
:class:`GcState`; a request's case is the :class:`~pytest_lstmperf.model.case.Case` itself, its float64 arrays
narrowed (:func:`narrow`).
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from ...model.case import Case


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


@dataclass(frozen=True)
class WorkerInfo:
    """A worker's hello, sent once its imports are done: the versions it runs, the GPUs its backend sees, and what
    each backend's cuDNN paths need (torch: a cuDNN version; JAX: jaxlib's cuDNN RNN; TensorFlow: a CUDA build)."""

    keras: str
    backend: str
    gpus: tuple[str, ...] = ()
    tensorflow: str = ""
    cuda_build: bool = False
    torch: str = ""
    cudnn: int | None = None
    jax: str = ""
    default_backend: str = ""
    cudnn_rnn: bool = False


@dataclass(frozen=True)
class GraphProbe:
    """TensorFlow only: the family of the graph Keras builds for a layer where it believes a GPU is present, and
    Keras's own ``cudnn_ok`` verdict; or the error the layer raised (the others None)."""

    cudnn_ok: bool | None = None
    family: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class JaxAttempt:
    """JAX only: whether Keras tried ``jax.experimental.rnn`` (cuDNN) for a layer, the error the layer raised,
    and whose loop the lowered module holds (``cell`` or ``backend``)."""

    attempted: bool = False
    error: str | None = None
    loop: str | None = None


@dataclass(frozen=True)
class GcState:
    """The worker's collector: objects frozen, runs held, released runs still alive."""

    frozen: int
    runs: int
    released_alive: int


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


#: a :class:`Case`'s fields that hold arrays (the others: its spec, seed and extras)
_ARRAYS = ("weights", "x", "h0", "c0", "grad_output", "grad_h_n", "grad_c_n")


class Narrowed:
    """A float64 array sent as float32 (see :func:`narrow`)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Any, ...]:
        return (Narrowed, (self.array,))


def narrow(value: Any) -> Any:
    """``value`` (arrays, ``None``, dicts of them, and a :class:`Case`'s arrays) with every float64 array whose
    values float32 holds exactly replaced by a float32 copy (:class:`Narrowed`): half the bytes through the pipe.
    A case's arrays hold values of the spec's dtype (``model.case``), float32 or narrower for every spec but a
    float64 one; the 1024-wide benchmark shapes sent 95 MB per prepared run. :func:`widen` restores the float64 array
    bit for bit; an array float32 cannot hold exactly is sent as it is."""
    if isinstance(value, Case):
        return replace(value, **{f.name: narrow(getattr(value, f.name)) for f in fields(Case) if f.name in _ARRAYS})
    if isinstance(value, dict):
        return {key: narrow(item) for key, item in value.items()}
    if isinstance(value, np.ndarray) and value.dtype == np.float64:
        single = value.astype(np.float32)
        if np.array_equal(single, value):
            return Narrowed(single)
    return value


def widen(value: Any) -> Any:
    """The inverse of :func:`narrow`."""
    if isinstance(value, Case):
        return replace(value, **{f.name: widen(getattr(value, f.name)) for f in fields(Case) if f.name in _ARRAYS})
    if isinstance(value, dict):
        return {key: widen(item) for key, item in value.items()}
    if isinstance(value, Narrowed):
        return value.array.astype(np.float64)
    return value
