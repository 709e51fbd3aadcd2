"""The Keras-only options of an LSTM/GRU layer: what a Keras layer is, beyond its framework-neutral
:class:`~pytest_lstmperf.model.spec.LayerSpec` (backend, ``use_cudnn``, activations, dropout, unroll,
``go_backwards``, the mask, the dtype policy), validated on construction.

Plain data: the Keras paths run layers built from it (:mod:`pytest_lstmperf.paths.keras.layer`), the explainer
and the eligibility report judge layers by it, and :func:`pytest_lstmperf.observe` describes the Keras layers a
user's code calls with it. Imports no framework.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .spec import reject_unknown_fields

if TYPE_CHECKING:
    from .spec import LayerSpec

Backend = Literal["tensorflow", "torch", "jax"]
BACKENDS: tuple[Backend, ...] = ("tensorflow", "torch", "jax")
MASK_STYLES = ("auto", "none", "right", "left", "holes")
#: Keras dtype policies a path may set; the mixed ones keep float32 variables and compute in 16 bits
DTYPE_POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
#: backends whose runner feeds mixed-precision outputs their own seeds (the others run float32 only)
MIXED_BACKENDS = ("jax",)
#: names keras.activations.get resolves in Keras 3.15; an observed layer's own function is named "custom:<name>"
ACTIVATIONS = (
    "tanh", "sigmoid", "relu", "linear", "hard_sigmoid", "elu", "selu", "gelu", "softsign", "softplus",
    "swish", "silu", "relu6", "leaky_relu", "mish", "exponential", "log_sigmoid", "hard_silu", "hard_swish",
    "hard_tanh", "tanh_shrink", "celu", "glu", "sparse_plus", "squareplus", "soft_shrink", "hard_shrink",
    "threshold", "sparse_sigmoid",
)  # fmt: skip


class KerasOptionsError(ValueError):
    """An invalid Keras option value; the message names the valid values."""


@dataclass(frozen=True)
class KerasOptions:
    """The Keras-only options of an LSTM/GRU layer, and how the path calls it."""

    backend: Backend = "tensorflow"
    use_cudnn: Literal["auto"] | bool = "auto"
    implementation: int = 2
    activation: str = "tanh"
    recurrent_activation: str = "sigmoid"
    recurrent_dropout: float = 0.0
    dropout: float = 0.0
    unroll: bool = False
    go_backwards: bool = False
    mask: str = "auto"
    return_sequences: bool = True
    return_state: bool = True
    #: call the layer with ``training=True`` (dropout active) or ``False`` (inference)
    call_training: bool = False
    #: the layers' Keras dtype policy (``float32``, or ``mixed_float16``/``mixed_bfloat16`` on float32 specs)
    dtype_policy: str = "float32"

    def __post_init__(self) -> None:
        problems = []
        if self.backend not in BACKENDS:
            problems.append(f"backend={self.backend!r} (valid: {', '.join(BACKENDS)})")
        if self.use_cudnn not in ("auto", True, False) or (
            isinstance(self.use_cudnn, int) and not isinstance(self.use_cudnn, bool)
        ):
            problems.append(f"use_cudnn={self.use_cudnn!r} (valid: 'auto', True, False)")
        if self.implementation not in (1, 2):
            problems.append(f"implementation={self.implementation!r} (valid: 1, 2)")
        for name in ("activation", "recurrent_activation"):
            value = getattr(self, name)
            if value not in ACTIVATIONS and not str(value).startswith("custom:"):
                problems.append(f"{name}={value!r} is not a Keras activation (valid: {', '.join(ACTIVATIONS)})")
        for name in ("recurrent_dropout", "dropout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
                problems.append(f"{name}={value!r} (must be a number in [0, 1))")
        if self.dtype_policy not in DTYPE_POLICIES:
            problems.append(f"dtype_policy={self.dtype_policy!r} (valid: {', '.join(DTYPE_POLICIES)})")
        elif self.dtype_policy != "float32" and self.backend not in MIXED_BACKENDS:
            problems.append(
                f"dtype_policy={self.dtype_policy!r} with backend={self.backend!r}: mixed-precision paths run on "
                f"{', '.join(MIXED_BACKENDS)} only"
            )
        if self.mask not in MASK_STYLES:
            problems.append(f"mask={self.mask!r} (valid: {', '.join(MASK_STYLES)})")
        for name in ("unroll", "go_backwards", "return_sequences", "return_state", "call_training"):
            if not isinstance(getattr(self, name), bool):
                problems.append(f"{name}={getattr(self, name)!r} (must be True or False)")
        if problems:
            raise KerasOptionsError("invalid KerasOptions: " + "; ".join(problems))

    def replace(self, **changes: Any) -> KerasOptions:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KerasOptions:
        reject_unknown_fields(cls, data, KerasOptionsError)
        return cls(**data)

    def differences(self) -> dict[str, Any]:
        """Fields that differ from the defaults (for ids and tables)."""
        default = KerasOptions(backend=self.backend)
        return {k: v for k, v in self.to_dict().items() if v != getattr(default, k) and k != "backend"}

    def short(self) -> str:
        parts = [f"{k}={v}" for k, v in self.differences().items()]
        return ",".join(parts) or "defaults"


def mask_style(spec: LayerSpec, options: KerasOptions) -> str:
    """The mask the layer sees: ``"none"``, ``"right"``, ``"left"`` or ``"holes"``."""
    if options.mask == "auto":
        return "right" if spec.length_mode == "packed" else "none"
    if options.mask == "none":
        return "none"
    return options.mask
