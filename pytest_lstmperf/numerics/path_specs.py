"""The specs drawn for one execution path: those it supports whose bounds the tolerance model can judge.

A spec whose bound reaches the tolerance model's cap (``tolerance.MAX_REL``) for its forward pass is not drawn;
one where only the backward bound would (bf16 gradients of large layers) is drawn in inference mode. Here, above
both the specs' strategies (:mod:`pytest_lstmperf.model.strategies`) and the registry of paths, because the rule
is the tolerance model's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeGuard

from ..model.spec import LayerSpec
from ..model.strategies import specs
from .tolerance import ToleranceTooLoose, tolerance

if TYPE_CHECKING:
    from hypothesis import strategies as st

    from ..model.profiles import ShapeBounds
    from ..model.spec import Lengths
    from ..paths import ExecutionPath


def _is_spec(spec: LayerSpec | None) -> TypeGuard[LayerSpec]:
    return spec is not None


def specs_for_path(path: ExecutionPath, bounds: ShapeBounds) -> st.SearchStrategy[LayerSpec]:
    """Specs that ``path`` supports: drawn with its input form in mind, then filtered by ``supports``."""
    options = getattr(path, "options", {})
    packed_only = options.get("packed") or (
        path.supports(LayerSpec()) is not None
        and path.supports(LayerSpec(length_mode="packed", lengths=(5, 3, 2, 1))) is None
    )
    modes: tuple[Lengths, ...] = ("packed",) if packed_only else ("none", "none", "padded")
    cells = tuple(options.get("cells", ("lstm", "gru")))
    reset = (True, False) if options.get("reset_before_ok") else (True,)
    # an inference-only path (ONNX Runtime) gets inference specs, rather than three in four refused
    training = (False,) if options.get("inference_only") else (True, True, True, False)
    base = specs(bounds, cells=cells, length_modes=modes, training=training, reset_after=reset)
    supported = base.filter(lambda spec: path.supports(spec) is None)
    return supported.map(lambda spec: checkable_spec(path, spec)).filter(_is_spec)


def _bound_ok(path: ExecutionPath, spec: LayerSpec, pass_: str) -> bool:
    family, precision = path.expected(spec)
    try:
        tolerance(precision, pass_, spec, family)
    except ToleranceTooLoose:
        return False
    except LookupError:
        return True  # no measured bound: the check itself says so
    return True


def checkable(path: ExecutionPath, spec: LayerSpec) -> bool:
    """Whether the bounds of the path's claimed kernel and precision stay below the tolerance model's cap
    (``tolerance.MAX_REL``) for every pass of ``spec``: beyond it a zero tensor would nearly pass."""
    return all(_bound_ok(path, spec, p) for p in (("forward", "backward") if spec.training else ("forward",)))


def checkable_spec(path: ExecutionPath, spec: LayerSpec) -> LayerSpec | None:
    """``spec``, or its inference-only form where only the backward bound would reach the cap (bf16
    gradients of large layers), or None where the forward one would: such specs are not generated, and a
    check handed one anyway fails as inconclusive."""
    if not _bound_ok(path, spec, "forward"):
        return None
    if spec.training and not _bound_ok(path, spec, "backward"):
        return spec.replace(training=False)
    return spec
