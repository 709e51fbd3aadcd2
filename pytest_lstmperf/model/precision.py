"""Dtype and precision names, in one table.

A spec computes in a dtype (``float32``, ``float64``, ``float16``, ``bfloat16``); a path claims, and a trace
observes, a precision (``fp32``, ``fp64``, ``fp16``, ``bf16``, and ``tf32``: float32 data whose products run in
TF32). :data:`DTYPE_PRECISION` is the one table between the two; a framework's own spellings of these types
(``torch.float16``, TensorFlow's ``half``, HLO's ``f16``, the profiler's ``c10::Half``) are translated where that
framework is read. A pass whose recurrent op took several element types ran in the narrowest
(:func:`narrowest`).
"""

from __future__ import annotations

from collections.abc import Iterable

DTYPES: tuple[str, ...] = ("float32", "float64", "float16", "bfloat16")
PRECISIONS: tuple[str, ...] = ("fp64", "fp32", "tf32", "fp16", "bf16")
#: the precision each dtype computes in
DTYPE_PRECISION: dict[str, str] = {"float32": "fp32", "float64": "fp64", "float16": "fp16", "bfloat16": "bf16"}
#: the 16-bit float precisions (mixed precision keeps float32 beside them)
HALF_PRECISIONS: tuple[str, ...] = ("fp16", "bf16")
#: the element precisions a trace can see, the narrowest first (``tf32`` is no element type: a kernel's)
NARROWEST_FIRST: tuple[str, ...] = ("fp16", "bf16", "fp32", "fp64")


def narrowest(found: Iterable[str]) -> str | None:
    """The narrowest element precision among ``found`` (other names ignored), None where there is none."""
    seen = set(found)
    return next((p for p in NARROWEST_FIRST if p in seen), None)
