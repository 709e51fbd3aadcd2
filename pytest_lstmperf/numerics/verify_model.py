"""Equivalence on a user's own model: every execution path of the device against a float64 run of the model.

:func:`verify_model` takes a ``torch.nn.Module`` (or a Keras model) with its real weights and example inputs, and
runs a copy of it on each path of the selected device, with only that path's switches changed: for a torch model
the registry's non-packed PyTorch paths (cuDNN fp32 / default math, generic CUDA, CPU oneDNN / native, autocast
fp16 / bf16; :mod:`.verify_torch` runs them), for a Keras model the model as built and, on a GPU, with cuDNN off
(:mod:`.verify_keras`). This module holds the entry point, what a path did (:class:`PathOutcome`, from one
:class:`ModelRun` each) and how it is judged, as the suites judge their own layers:

* the kernel of every recurrent layer call (forward, per call) and of the backward pass, against what the path
  claims for that layer (:meth:`ExecutionPath.expected`, judged by :func:`pytest_lstmperf.numerics.checks.judge_trace`);
  a layer the path does not claim (a GRU on the oneDNN path: PyTorch has no oneDNN GRU) is listed, not judged;
* every output and every gradient (w.r.t. the parameters and the floating-point inputs) against the float64
  run of a deep copy of the model, within the tolerance of the kernel family and precision the pass was
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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..model.spec import LayerSpec
from .checks import Mismatch, format_failure, judge_trace, relative_error
from .tolerance import Tolerance, bound_of_what_ran

SEED = 0


class ModelCheckFailed(AssertionError):
    """A path of the user's model disagreed with what it claims; the message is the suites' failure report."""


class NotComparedWarning(UserWarning):
    """Outputs or gradients of a path were not compared (their bound would reach ``tolerance.MAX_REL``) and the
    caller did not accept them by name: the check is inconclusive for them, never a pass."""


class KnownFindingWarning(UserWarning):
    """A path ran something other than it claims, as a documented known finding says it does; its numbers
    were checked against the bound of what ran and passed."""


@dataclass
class PathOutcome:
    """What one path of the model did: the kernel per recurrent layer call, the errors, the mismatches."""

    path: str
    traces: list[Any] = field(default_factory=list)
    errors: dict[str, float] = field(default_factory=dict)
    mismatches: list[Mismatch] = field(default_factory=list)
    skipped: str | None = None
    report: str = ""
    #: tensors not compared, with why (a bound that would reach ``tolerance.MAX_REL``: bf16 gradients of large
    #: layers); listed in the report; ``verify_model`` raises for them unless accepted by name
    unchecked: list[str] = field(default_factory=list)
    #: the names of the quantities in ``unchecked`` (``"grad lstm.weight_hh_l0"``), in the same order
    unchecked_quantities: list[str] = field(default_factory=list)
    #: those of ``unchecked_quantities`` the caller accepted (``verify_model(accept_unchecked=...)``)
    accepted: list[str] = field(default_factory=list)
    #: the known findings that explained a departure from the claim ("forward LSTM(...): <why>"), not failed
    known: list[str] = field(default_factory=list)
    #: pass -> the bound its tensors were held to ("onednn/fp32 forward 2.9e-06")
    bounds: dict[str, str] = field(default_factory=dict)

    @property
    def not_compared(self) -> list[str]:
        """The quantities not compared that the caller did not accept: each makes the path inconclusive."""
        return [q for q in self.unchecked_quantities if q not in self.accepted]

    @property
    def ok(self) -> bool:
        """Ran, met every check, and compared everything it was not told to leave out."""
        return self.skipped is None and not self.mismatches and not self.not_compared


@dataclass
class ModelRun:
    """One run of the model (the float64 reference, or a path): outputs and gradients as float64 arrays, the
    trace of every recurrent layer call, and each layer's spec as it was called (torch models)."""

    outputs: list[np.ndarray]
    grads: dict[str, np.ndarray]
    traces: list[Any]
    layer_shapes: dict[str, LayerSpec]
    #: recurrent layer calls that ran but could not be observed: each fails the path (never a silent pass)
    problems: list[str] = field(default_factory=list)
    #: the model has parameters outside its recurrent layers (they run in the path's precision: :func:`_pass_bound`)
    other_layers: bool = False

    def quantities(self) -> dict[str, np.ndarray]:
        """Every output and gradient by name (``"output 0"``, ``"grad lstm.weight_hh_l0"``)."""
        return {f"output {i}": v for i, v in enumerate(self.outputs)} | {f"grad {k}": v for k, v in self.grads.items()}


def envelope_spec(specs: Sequence[LayerSpec]) -> LayerSpec:
    """One spec whose growth bounds the model's: depth summed, widths and length the largest."""
    return LayerSpec(
        cell=specs[0].cell,
        input_size=max(s.input_size for s in specs),
        hidden_size=max(s.hidden_size for s in specs),
        num_layers=sum(s.num_layers * s.directions for s in specs),
        seq_len=max(s.seq_len for s in specs),
        batch=max(s.batch for s in specs),
    )


# ------------------------------------------------------------------------------------------ entry point
def model_paths(device: str, names: Sequence[str] | None = None) -> list[Any]:
    """The PyTorch paths a user's model runs on ``device`` (``cpu``/``cuda``): the registry's non-packed ones."""
    from .. import paths as registry

    kind = device.split(":")[0]
    chosen = registry.for_device(kind, names)
    return [p for p in chosen if p.framework == "torch" and not p.options.get("packed")]


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
    # the runners import this module: they are imported when a model is verified
    if hasattr(model, "_flatten_layers"):  # a Keras model (on the torch backend also an nn.Module)
        from .verify_keras import verify_keras_model

        outcomes = verify_keras_model(model, example_inputs, device=device, paths=paths)
    else:
        from .verify_torch import verify_torch_model

        outcomes = verify_torch_model(model, example_inputs, device=device, paths=paths)
    return _finish(outcomes, raise_on_failure, accept_unchecked)


def _accept(outcomes: list[PathOutcome], accept_unchecked: Sequence[str]) -> None:
    """Mark the accepted quantities of each outcome; a name that matches no quantity of the model is a
    ``ValueError`` naming the valid ones (a typo must not leave something unchecked in silence)."""
    from fnmatch import fnmatchcase

    from .. import paths as registry

    known = {q for o in outcomes for q in (*o.errors, *o.unchecked_quantities)}
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

    _accept(outcomes, accept_unchecked)
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


# ------------------------------------------------------------------------------------------ judging
def conclude(
    outcome: PathOutcome,
    path: Any,
    run: ModelRun,
    ref: ModelRun,
    claimed: tuple,
    spec: LayerSpec,
    keras: bool = False,
    sensitivity: Any = None,
) -> None:
    """Judge ``run`` (kernels, numbers) and write the outcome's mismatches and report."""
    outcome.traces = run.traces
    mismatches = _check_kernels(path, run, outcome.known, claimed if keras else None)
    mismatches += [Mismatch("kernel", "observation", problem) for problem in dict.fromkeys(run.problems)]
    outcome.mismatches = mismatches + _check_numbers(run, ref, claimed, spec, outcome, sensitivity)
    lines = [f"  observed: {t.describe()}" for t in run.traces]
    lines += [f"  known finding (expected, not failed): {line}" for line in outcome.known]
    lines += [f"  bound: {bound}" for bound in outcome.bounds.values()]
    lines += [f"  not checked: {line}" for line in outcome.unchecked]
    outcome.report = format_failure(path.name, spec, SEED, outcome.mismatches) + "\n" + "\n".join(lines)


def _judge(path: Any, expected: tuple[str, str], trace: Any, where: str, known: list[str]) -> list[Mismatch]:
    """One trace against the claim, by the suites' rule (:func:`pytest_lstmperf.numerics.checks.judge_trace`): a
    difference that known findings of ``path`` document is added to ``known`` (with the versions note), any other
    is a mismatch."""
    from ..observation.claims import current_versions

    found, explained = judge_trace(path, expected, trace, where)
    if not explained:
        return found
    versions = current_versions(getattr(path, "framework", "torch"))
    known += [f"{where}: [{f.check}: observed {f.observed}] {f.describe(versions)}" for f in explained]
    return []


def _check_kernels(path: Any, run: ModelRun, known: list[str], claim: tuple[str, str] | None = None) -> list[Mismatch]:
    """Each forward layer call against the path's claim for that layer; the backward pass against the claim
    shared by every claimed layer (when they differ, the backward pass is listed, not judged). With ``claim``
    (a Keras path: one claim for every layer), every traced layer call and pass against it."""
    found: list[Mismatch] = []
    claims = set()
    none_ran = Mismatch("kernel", "forward", "no recurrent layer ran in the model's forward pass")
    if claim is not None:  # Keras: TensorFlow traces the whole block (phase "test"), torch each layer call
        if not any(t.family != "none" for t in run.traces):
            return [none_ran]
        return [m for t in run.traces for m in _judge(path, claim, t, f"{t.phase} {t.detail}", known)]
    forward = [t for t in run.traces if t.phase == "forward"]
    if not forward:
        return [none_ran]
    for trace in forward:
        spec = run.layer_shapes.get(trace.detail)
        if spec is None or path.supports(spec) is not None:
            continue
        claims.add(path.expected(spec))
        found += _judge(path, path.expected(spec), trace, f"forward {trace.detail}", known)
    if len(claims) == 1:
        for trace in (t for t in run.traces if t.phase == "backward"):
            found += _judge(path, next(iter(claims)), trace, "backward", known)
    return found


def _pass_bound(
    run: ModelRun, pass_: str, claimed: tuple[str, str], spec: LayerSpec, other_layers: bool = False
) -> Tolerance:
    """The bound of ``pass_`` by the suites' rule, :func:`pytest_lstmperf.numerics.tolerance.bound_of_what_ran`
    over the kernel family and precision of every trace of the pass: fp16 where bf16 was claimed is held to
    fp16; fp32 kernels where TF32 is allowed keep the TF32 bound; the claim's where nothing was traced; where the
    layers ran different kernels, the loosest of their bounds (the model errs no less than its least precise
    layer). On top of it, a model with ``other_layers`` (parameters outside its recurrent layers) runs them in
    the path's precision (autocast casts a ``Linear`` to bf16 whatever cuDNN ran), so the claim's (family,
    precision) joins what ran: on the H100 the translation model's attention gradients, computed in bf16, failed
    the fp16 bound of its cuDNN GRUs (3.5e-2 against 1.9e-2)."""
    ran = [(t.family, t.precision) for t in run.traces if t.phase == pass_]
    return bound_of_what_ran(claimed, [*ran, claimed] if other_layers else ran, pass_, spec)


def _check_numbers(
    run: ModelRun,
    ref: ModelRun,
    claimed: tuple[str, str],
    spec: LayerSpec,
    outcome: PathOutcome,
    sensitivity: Any = None,
) -> list[Mismatch]:
    """Every output and gradient: finite, and within the bound of what its pass ran (:func:`_pass_bound`),
    widened by the model's ``sensitivity`` where it exceeds the canonical data's; fills ``outcome.errors``,
    ``outcome.bounds`` and ``outcome.unchecked``."""
    from .tolerance import MAX_REL, ToleranceTooLoose

    found: list[Mismatch] = []
    pairs: list[tuple[str, str, np.ndarray | None, np.ndarray]] = [
        ("forward", f"output {i}", v, r) for i, (v, r) in enumerate(zip(run.outputs, ref.outputs, strict=True))
    ]
    pairs += [("backward", f"grad {k}", run.grads.get(k), r) for k, r in ref.grads.items()]
    for pass_, quantity, value, reference in pairs:
        if value is None:
            found.append(Mismatch("missing", quantity, f"{quantity}: the path computed none"))
            continue
        if not np.isfinite(value).all():
            bad = int((~np.isfinite(value)).sum())
            found.append(Mismatch("nan", quantity, f"{quantity}: {bad} of {value.size} values are NaN or Inf"))
            continue
        err = relative_error(value, reference)
        outcome.errors[quantity] = err
        try:
            tol = _pass_bound(run, pass_, claimed, spec, run.other_layers)
        except ToleranceTooLoose as exc:
            if pass_ == "forward":  # an output that cannot be checked is a failure, never a pass
                found.append(Mismatch("inconclusive", quantity, f"{quantity}: not checkable: {exc}"))
            else:
                _not_compared(outcome, quantity, f"{quantity}: not compared (relative error {err:.3e}): {exc}")
            continue
        bound, why = tol.rel, tol.explain()
        if sensitivity is not None and sensitivity.factor(quantity, pass_) > 1.0:
            bound *= sensitivity.factor(quantity, pass_)
            why += "; " + sensitivity.explain(quantity, pass_)
            if bound >= MAX_REL:
                over = f", above the unwidened bound {tol.rel:.3g}" if err > tol.rel else ""
                text = (
                    f"{quantity}: not compared (relative error {err:.3e}{over}): the widened bound {bound:.3g} "
                    f"reaches {MAX_REL} ({why})"
                )
                if pass_ == "forward":
                    found.append(Mismatch("inconclusive", quantity, text))
                else:
                    _not_compared(outcome, quantity, text)
                continue
            # the report says which bound was widened, by how much and why, pass or fail
            outcome.bounds[quantity] = f"{quantity} {bound:.3g} ({sensitivity.explain(quantity, pass_)})"
        outcome.bounds.setdefault(pass_, f"{tol.family}/{tol.precision} {pass_} {tol.rel:.3g}")
        if err > bound:
            found.append(
                Mismatch(
                    "tolerance",
                    quantity,
                    f"{quantity}: relative error {err:.3e} against the float64 run exceeds the "
                    f"{tol.family}/{tol.precision} {pass_} tolerance {bound:.3e} ({err / bound:.1f}x; tolerance {why})",
                )
            )
    return found


def _not_compared(outcome: PathOutcome, quantity: str, text: str) -> None:
    outcome.unchecked.append(text)
    outcome.unchecked_quantities.append(quantity)
