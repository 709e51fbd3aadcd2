"""Equivalence on a user's own model: every execution path of the device against a float64 run of the model.

:func:`verify_model` takes a ``torch.nn.Module`` (or a Keras model) with its real weights and example inputs, and
runs a copy of it on each path of the selected device, with only that path's switches changed: for a torch model
the registry's non-packed PyTorch paths (cuDNN fp32 / default math, generic CUDA, CPU oneDNN / native, autocast
fp16 / bf16; :mod:`.verify_torch` runs them), for a Keras model the model as built and, on a GPU, with cuDNN off
(:mod:`.verify_keras`). This module holds the entry point and what is raised or warned; what a path did
(:class:`PathOutcome`, from one :class:`ModelRun` each) and how it is judged, as the suites judge their own layers,
is :mod:`.model_judge`:

* the kernel of every recurrent layer call (forward, per call) and of the backward pass, against what the path
  claims for that layer (:meth:`ExecutionPath.expected`, judged by :func:`pytest_lstmperf.numerics.checks.judge_trace`);
  a layer the path does not claim (a GRU on the oneDNN path: PyTorch has no oneDNN GRU) is listed, not judged;
* every output and every gradient (w.r.t. the parameters and the floating-point inputs) against the float64
  run of a deep copy of the model (its recurrent layers computed by the plugin's numpy recurrence, not by
  torch's kernels: :mod:`.torch_reference`), within the tolerance of the kernel family and precision the pass was
  observed to run (:func:`pytest_lstmperf.numerics.tolerance.bound_of_what_ran`), and finite;
* what could not be compared (a bound that would reach ``tolerance.MAX_REL``) is never a pass: it fails, or,
  for a gradient, is listed and raised unless the caller accepts it by name (:class:`NotComparedWarning`).

Known findings (:mod:`pytest_lstmperf.observation.claims`, the suites' one table and lookup) apply as in the
suites: a departure from the path's claim that a finding documents (bf16 autocast running cuDNN in fp16 on the
H100) is reported as that finding (:class:`KnownFindingWarning`, ``PathOutcome.known``), not failed; it changes
only what the path is expected to run, never whether its numbers are checked: NaN/Inf always fail, and every
tensor is held to the bound of what ran (fp16 there).

The tolerance's growth comes from an *envelope* spec of the recurrent layers found in the model
(:func:`envelope_spec`): depth = the sum of their layers (a cell called in a loop counts one layer), width = the
largest input and hidden sizes, length = the longest sequence one layer call saw (a cell's number of calls per
forward). Stacked layers compound their errors like the layers of one ``nn.LSTM``, which is what the suites
measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import paths as registry
from .model_judge import (
    SEED,
    KnownFindingWarning,
    ModelCheckFailed,
    ModelRun,
    NotComparedWarning,
    PathOutcome,
    conclude,
    envelope_spec,
    model_paths,
)
from .verify_keras import verify_keras_model
from .verify_torch import verify_torch_model

__all__ = [
    "SEED",
    "KnownFindingWarning",
    "ModelCheckFailed",
    "ModelRun",
    "NotComparedWarning",
    "PathOutcome",
    "conclude",
    "envelope_spec",
    "model_paths",
    "verify_model",
]


def verify_model(
    model: Any,
    example_inputs: Any,
    *,
    device: str = "cpu",
    paths: Sequence[str] | None = None,
    raise_on_failure: bool = True,
    accept_unchecked: Sequence[str] = (),
) -> list[PathOutcome]:
    """Run ``model`` (a ``torch.nn.Module``, its real weights) on every applicable path of ``device`` and
    compare outputs and gradients with a float64 run of it on the same device; raise :class:`ModelCheckFailed`
    with the suites' report when a path disagrees, or when a gradient could not be compared (its bound would
    reach ``tolerance.MAX_REL``) and is not named in ``accept_unchecked`` (``"grad lstm.weight_hh_l0"`` for
    every path, ``"torch-cpu-autocast-bf16: grad lstm.weight_hh_l0"`` for one; shell-style patterns such as
    ``"*-autocast-bf16: grad *"`` accept every quantity they match, and must match one). ``raise_on_failure=False``
    returns the outcomes only, and warns (:class:`NotComparedWarning`) of what was not compared.

    ``example_inputs``: one tensor or a tuple of positional arguments (nested tuples, e.g. ``(h0, c0)``, are
    fine; integer tensors such as token ids are left as they are)."""
    if isinstance(accept_unchecked, str):
        accept_unchecked = (accept_unchecked,)
    if hasattr(model, "_flatten_layers"):  # a Keras model (on the torch backend also an nn.Module)
        outcomes = verify_keras_model(model, example_inputs, device=device, paths=paths)
    else:
        outcomes = verify_torch_model(model, example_inputs, device=device, paths=paths)
    return _finish(outcomes, raise_on_failure, accept_unchecked)


def _accept(outcomes: list[PathOutcome], accept_unchecked: Sequence[str]) -> None:
    """Mark the accepted quantities of each outcome; a name that matches no quantity of the model is a
    ``ValueError`` naming the valid ones (a typo must not leave something unchecked in silence)."""
    from fnmatch import fnmatchcase

    # a quantity that failed (a NaN gradient has no error and is not "unchecked") is still one of the model's
    known = {q for o in outcomes for q in (*o.errors, *o.unchecked_quantities, *(m.quantity for m in o.mismatches))}
    # a path may be named that this device does not run (one test accepting the bf16 paths of CPU and GPU)
    paths = set(registry.all_paths()) | {o.path for o in outcomes}
    for name in accept_unchecked:
        path, sep, quantity = str(name).partition(": ")
        if not sep:
            path, quantity = "*", str(name)
        if not any(fnmatchcase(q, quantity) for q in known) or not any(fnmatchcase(p, path) for p in paths):
            valid = ", ".join(sorted(known)) or "none"
            raise ValueError(
                f"accept_unchecked: {name!r} names no quantity of this model (valid: a quantity, or "
                f"'<path>: <quantity>' with a registered path (`lstmperf paths`); shell-style patterns such as "
                f"'*-autocast-bf16: grad *' match several; quantities: {valid})"
            )
        for o in outcomes:
            if fnmatchcase(o.path, path):
                o.accepted += [q for q in o.unchecked_quantities if fnmatchcase(q, quantity) and q not in o.accepted]


def _finish(
    outcomes: list[PathOutcome], raise_on_failure: bool, accept_unchecked: Sequence[str] = ()
) -> list[PathOutcome]:
    """Warn of each known finding of a path that passed; raise the failed paths' reports, and the paths that
    left quantities not compared that the caller did not accept (``raise_on_failure=False``: warn of them)."""
    import warnings

    try:
        _accept(outcomes, accept_unchecked)
    except ValueError as exc:  # a NaN or Inf is reported first, whatever the arguments
        nan = [o.report for o in outcomes if any(m.check == "nan" for m in o.mismatches)]
        if nan:
            raise ModelCheckFailed("\n".join([*nan, f"(also: {exc})"])) from exc
        raise
    for o in outcomes:
        if o.known and not o.mismatches:
            bounds = "; ".join(o.bounds.values()) or "-"
            text = f"known finding on {o.path}: {' | '.join(o.known)}; numbers checked against the bound of what ran"
            warnings.warn(KnownFindingWarning(f"{text} ({bounds}) and passed"), stacklevel=3)
    failed = [o for o in outcomes if o.mismatches]
    open_ = [o for o in outcomes if o.not_compared and not o.mismatches]
    blocks = [o.report for o in failed]
    for o in open_:
        lines = [line for line, q in zip(o.unchecked, o.unchecked_quantities, strict=True) if q not in o.accepted]
        blocks.append(
            f"path {o.path}: {len(lines)} quantity(ies) not compared (inconclusive, never a pass); accept them by "
            f"name with verify_model(..., accept_unchecked=[...]) or leave this path out with paths=[...]:\n"
            + "\n".join(f"  not compared: {line}" for line in lines)
        )
    if blocks and raise_on_failure:
        raise ModelCheckFailed("\n".join(blocks))
    for o in open_:
        warnings.warn(
            NotComparedWarning(f"{o.path}: not compared (inconclusive): {', '.join(o.not_compared)}"), stacklevel=3
        )
    return outcomes
