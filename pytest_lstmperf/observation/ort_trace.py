"""Kernel trace for ONNX Runtime: which node ran the recurrence, on which execution provider, in which type.

ONNX Runtime's own profiler (``SessionOptions.enable_profiling``) writes one event per executed node with its
``op_name`` (the ONNX operator: ``LSTM``, ``GRU``, ``MatMul``, ``Loop``, ...), the ``provider`` that ran it
(``CPUExecutionProvider``, ``CUDAExecutionProvider``) and ``input_type_shape`` (element types). That is all
the runtime reports: which library routine the provider calls inside its LSTM kernel (MLAS GEMMs on the CPU;
cuDNN's RNN API in the CUDA provider's LSTM, per ONNX Runtime's source) is not observable from the profile,
and the family names say only what was observed:

* ``ort-rnn``: an ``LSTM``/``GRU`` node ran on the CPU provider (ONNX Runtime's own recurrent kernel);
* ``ort-cuda-rnn``: an ``LSTM``/``GRU`` node ran on the CUDA provider;
* ``ort-decomposed``: no recurrent node ran, but products did (the exporter lowered the recurrence to
  ``Loop``/``Scan``/``MatMul`` nodes);
* ``mixed``: recurrent nodes ran on more than one provider; ``none``: no recurrent work at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..model.precision import narrowest
from .torch_trace import KernelTrace

RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})
PRODUCT_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul", "MatMulInteger", "Einsum"})
LOOP_OPS = frozenset({"Loop", "Scan"})
_PROVIDER_FAMILY = {"CPUExecutionProvider": "ort-rnn", "CUDAExecutionProvider": "ort-cuda-rnn"}
#: ONNX Runtime profile element types -> precision
_ORT_DTYPES = {"float": "fp32", "double": "fp64", "float16": "fp16", "bfloat16": "bf16"}


def node_events(profile: Iterable[dict]) -> list[dict]:
    """The per-node events of an ONNX Runtime profile (its JSON list), each ``args`` with op and provider."""
    return [e for e in profile if e.get("cat") == "Node" and "op_name" in e.get("args", {})]


def classify_ort_nodes(nodes: Sequence[tuple[str, str]]) -> str:
    """The family from ``(op_name, provider)`` pairs of executed nodes (see the module docstring)."""
    recurrent = {provider for op, provider in nodes if op in RECURRENT_OPS}
    if len(recurrent) > 1:
        return "mixed"
    if recurrent:
        provider = recurrent.pop()
        return _PROVIDER_FAMILY.get(provider, f"ort-{provider}")
    ops = {op for op, _ in nodes}
    if ops & PRODUCT_OPS:
        return "ort-decomposed"
    return "none"


def _element_types(args: dict) -> list[str]:
    types = []
    for entry in args.get("input_type_shape", []):
        types += [_ORT_DTYPES.get(name, name) for name in entry]
    return types


def trace_from_profile(profile: Iterable[dict], phase: str = "forward", provider_note: str = "") -> KernelTrace:
    """A :class:`KernelTrace` from an ONNX Runtime profile: ``ops`` are ``op@provider`` of every executed node,
    ``dtypes`` the element types entering the recurrent node (else the products)."""
    events = node_events(profile)
    nodes = [(e["args"]["op_name"], e["args"].get("provider", "?")) for e in events]
    family = classify_ort_nodes(nodes)
    key = RECURRENT_OPS if any(op in RECURRENT_OPS for op, _ in nodes) else PRODUCT_OPS
    dtypes = [d for e in events if e["args"]["op_name"] in key for d in _element_types(e["args"])[:1]]
    precision = narrowest(dtypes) or "unknown"
    detail = "ONNX Runtime profile (node, provider); the library routine inside a provider's kernel is not observable"
    if provider_note:
        detail += f"; {provider_note}"
    return KernelTrace(
        family=family,
        precision=precision,
        phase=phase,
        ops=tuple(dict.fromkeys(f"{op}@{provider}" for op, provider in nodes)),
        kernels=(),
        dtypes=tuple(dict.fromkeys(dtypes)),
        detail=detail,
    )


def read_profile(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)
