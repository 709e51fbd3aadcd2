"""A user's ``torch.nn.Module`` run for :func:`pytest_lstmperf.numerics.verify_model.verify_model`: the float64
reference, each PyTorch path of the device and the model's sensitivity on its own data.

Each run is a deep copy of the model on the device, in float64 (the reference) or float32 under one path's
switches and autocast, with its floating-point inputs cast alike; tensors the model makes without a dtype
follow the run's. Every recurrent layer call is traced (kernel family and precision, forward and backward) and
its spec recorded as it was called (batch and length; a cell's length is its number of calls per forward), for
the envelope spec the bounds grow with. Dropout is set to 0 in the copies (each path would draw other random
numbers); the user's model is not changed.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..device import resolve_device
from ..model.spec import Cell, LayerSpec
from ..observation.calls import rnn_calls, torch_layer
from ..observation.layer_trace import LayerRecorder, layer_name, torch_layer_trace
from ..paths.torch_paths import path_autocast, path_switches
from .checks import Mismatch, format_failure
from .model_judge import SEED, ModelRun, PathOutcome, call_claim, conclude, envelope_spec, model_paths
from .sensitivity import Sensitivity, canonical, perturb, relative_changes
from .torch_reference import numpy_recurrence


def recurrent_layers(model: Any) -> list[Any]:
    import torch

    kinds = (torch.nn.RNNBase, torch.nn.RNNCellBase)
    return [m for m in model.modules() if isinstance(m, kinds)]


def layer_spec(module: Any, seq_len: int = 1, batch: int = 1) -> LayerSpec:
    """The LayerSpec of one torch recurrent module (a cell is a one-layer, one-step layer)."""
    import torch

    cell: Cell = "gru" if isinstance(module, (torch.nn.GRU, torch.nn.GRUCell)) else "lstm"
    return LayerSpec(
        cell=cell,
        input_size=module.input_size,
        hidden_size=module.hidden_size,
        num_layers=getattr(module, "num_layers", 1),
        bidirectional=bool(getattr(module, "bidirectional", False)),
        proj_size=getattr(module, "proj_size", 0) or 0,
        bias=bool(module.bias),
        batch=batch,
        seq_len=seq_len,
    )


def _map_tensors(value: Any, fn: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        mapped = [_map_tensors(v, fn) for v in value]
        return type(value)(mapped) if not hasattr(value, "_fields") else type(value)(*mapped)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    return value


def _tensors(value: Any) -> list[Any]:
    found: list[Any] = []

    def keep(t: Any) -> Any:
        found.append(t)
        return t

    _map_tensors(value, keep)
    return found


def _without_dropout(model: Any) -> Any:
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        if isinstance(module, torch.nn.RNNBase):
            module.dropout = 0.0
    return model.train()


def _moved(t: Any, device: str, dtype: Any) -> Any:
    """One input as a run takes it: floating-point tensors in the run's dtype on its device, integer tensors on
    its device, except a 1-D integer tensor given on the CPU, which stays there: sequence lengths, which
    ``pack_padded_sequence`` takes on the CPU only (moved, a CUDA run raised "'lengths' argument should be a 1D
    CPU int64 tensor")."""
    if not t.is_floating_point() and t.dim() == 1 and t.device.type == "cpu":
        return t.detach()
    return t.detach().to(device=device, dtype=dtype if t.is_floating_point() else None)


def _run(model: Any, inputs: tuple[Any, ...], device: str, dtype: Any, path: Any = None) -> ModelRun:
    """Forward and backward of a copy of ``model`` on ``device`` in ``dtype``, under ``path``'s switches. In
    float64 (the reference) the recurrent layers compute by the plugin's numpy recurrence
    (:func:`.torch_reference.numpy_recurrence`), not by torch's kernels; a path's run (float32) computes the
    other layers in IEEE fp32 on CUDA (:func:`ieee_other_layers`)."""
    import torch

    copy_ = _without_dropout(copy.deepcopy(model)).to(device=device, dtype=dtype)
    args = _map_tensors(inputs, lambda t: _moved(t, device, dtype))
    leaves = [t for t in _tensors(args) if t.is_floating_point()]
    for leaf in leaves:
        leaf.requires_grad_(True)
    shapes = _shape_hooks(copy_)
    spy = shapes.pop("_spy")
    recorder = LayerRecorder()
    reference = numpy_recurrence() if dtype == torch.float64 else ieee_other_layers(torch, device)
    with _switches(path), reference, spy, torch_layer_trace(recorder), _default_dtype(torch, dtype):
        with _autocast(path, device):
            out = copy_(*args)
        outs = [t for t in _tensors(out) if t.is_floating_point()]
        generator = torch.Generator().manual_seed(SEED)
        seeds = [torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in outs]
        loss = sum((t.to(torch.float64) * s.to(t.device)).sum() for t, s in zip(outs, seeds, strict=True))
        loss.backward()
    for handle in shapes.pop("_handles"):
        handle.remove()
    calls = shapes.pop("_calls")
    grads = {name: p.grad for name, p in copy_.named_parameters() if p.grad is not None}
    grads.update({f"input {i}": leaf.grad for i, leaf in enumerate(leaves) if leaf.grad is not None})
    recurrent = {
        id(p)
        for m in copy_.modules()
        if isinstance(m, (torch.nn.RNNBase, torch.nn.RNNCellBase))
        for p in m.parameters()
    }
    return ModelRun(
        outputs=[t.detach().double().cpu().numpy() for t in outs],
        grads={k: v.detach().double().cpu().numpy() for k, v in grads.items()},
        traces=recorder.traces(),
        layer_shapes=shapes,
        other_layers=any(id(p) not in recurrent for p in copy_.parameters()),
        call_specs=calls,
    )


@contextlib.contextmanager
def _default_dtype(torch: Any, dtype: Any) -> Any:
    """``dtype`` as torch's default floating dtype for the run: tensors the model makes itself without a dtype
    (``torch.zeros(1, 1, hidden)`` for a first hidden state) follow the run's dtype, float64 in the reference."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _shape_hooks(model: Any) -> dict[str, Any]:
    """Records each recurrent layer's spec with the batch and length it was called with: per run of an
    ``nn.LSTM``/``nn.GRU`` forward its real shape, in ``"_calls"`` in call order (a ``PackedSequence`` as
    packed, with its batch, lengths and longest length, also where a subclass packs inside its own forward:
    :func:`pytest_lstmperf.observation.calls.rnn_calls`, entered by :func:`_run` as ``"_spy"``); by layer name
    each distinct call spec (a layer called on two different sequences, an encoder's and a decoder's, keeps both:
    ``"LSTM(...)"`` and ``"LSTM(...) [call 2]"``); a cell's length is its number of calls per forward; a plain
    ``nn.RNN`` by a hook on its call."""
    import torch

    specs: dict[str, Any] = {"_handles": [], "_calls": []}
    mine = {id(m) for m in model.modules()}

    def add(name: str, spec: LayerSpec) -> None:
        specs["_calls"].append((name, spec))
        distinct = [s for n, s in specs["_calls"] if n == name]
        if spec not in distinct[:-1]:
            index = len(dict.fromkeys(distinct))
            specs[name if index == 1 else f"{name} [call {index}]"] = spec

    def record(mod: Any, args: tuple[Any, ...]) -> None:
        if id(mod) in mine:
            add(layer_name(mod), torch_layer(mod, args)[1].replace(dtype="float32", initial_state=False))

    specs["_spy"] = rnn_calls(record)
    for module in model.modules():
        if not isinstance(module, (torch.nn.RNNBase, torch.nn.RNNCellBase)) or isinstance(
            module, (torch.nn.LSTM, torch.nn.GRU)
        ):
            continue

        def hook(mod: Any, args: tuple[Any, ...], _name: str = layer_name(module)) -> None:
            data = args[0]
            data = getattr(data, "data", data)
            if isinstance(mod, torch.nn.RNNCellBase):
                seen = specs.get(_name)
                specs[_name] = layer_spec(mod, (seen.seq_len + 1) if seen else 1, int(data.shape[0]))
            elif data.dim() == 3:
                t, b = (data.shape[1], data.shape[0]) if mod.batch_first else (data.shape[0], data.shape[1])
                add(_name, layer_spec(mod, int(t), int(b)))
            else:
                add(_name, layer_spec(mod, int(data.shape[0]), 1))

        specs["_handles"].append(module.register_forward_pre_hook(hook))
    return specs


def ieee_other_layers(torch: Any, device: str) -> contextlib.AbstractContextManager[object]:
    """On CUDA, the layers around the recurrent ones compute in IEEE fp32 during a path's run: matrix products
    (``torch.set_float32_matmul_precision("highest")``, torch's default) and cuDNN convolutions
    (``torch.backends.cudnn.conv.fp32_precision = "ieee"``; torch's default lets them run TF32 on Ampere and
    newer). What the recurrent layers run is left to the path (``cudnn.rnn``'s precision is not touched): the
    check is of the recurrent kernel, and a bound wide enough for TF32 convolutions (a Conv2D's gradients 2.6e-2
    off float64 on an H100) would pass recurrent errors as large. A torch without the per-operation switch
    (before 2.9) keeps its convolutions as they are (``docs/own-model.md``)."""
    if not device.startswith("cuda"):
        return contextlib.nullcontext()
    return _ieee(torch)


@contextlib.contextmanager
def _ieee(torch: Any) -> Any:
    matmul = torch.get_float32_matmul_precision()
    conv = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", None)
    try:
        torch.set_float32_matmul_precision("highest")
        if conv is not None:
            torch.backends.cudnn.conv.fp32_precision = "ieee"
        yield
    finally:
        torch.set_float32_matmul_precision(matmul)
        if conv is not None:
            torch.backends.cudnn.conv.fp32_precision = conv


def _per_layer(shapes: dict[str, LayerSpec]) -> list[LayerSpec]:
    """One spec per layer for the envelope: a layer called on several sequences (``"LSTM(...) [call 2]"``, an
    encoder's and a decoder's) counts its layers once, over the lengths of its calls together (its state may
    carry from one call to the next, as DeepAR's decoder continues from its encoder's)."""
    merged: dict[str, LayerSpec] = {}
    for name, spec in shapes.items():
        layer = name.split(" [call ")[0]
        seen = merged.get(layer)
        dense = spec.replace(length_mode="none", lengths=None)
        merged[layer] = (
            dense
            if seen is None
            else seen.replace(seq_len=seen.seq_len + spec.seq_len, batch=max(seen.batch, spec.batch))
        )
    return list(merged.values())


def _switches(path: Any) -> contextlib.AbstractContextManager[object]:
    import torch

    return path_switches(torch, {} if path is None else path.options)


def _autocast(path: Any, device: str) -> contextlib.AbstractContextManager[object]:
    import torch

    return path_autocast(torch, {} if path is None else path.options, device.split(":")[0])


def _sensitivity(model: Any, inputs: tuple[Any, ...], ref: ModelRun, spec: LayerSpec, device: str = "cpu") -> Any:
    """This model's sensitivity on its own data against the canonical data's (:mod:`.sensitivity`)."""
    import torch

    def moved(rng: np.random.Generator) -> dict[str, np.ndarray]:
        twin = copy.deepcopy(model).to("cpu", torch.float64)
        with torch.no_grad():
            for param in twin.parameters():
                param.copy_(torch.from_numpy(perturb(param.numpy(), rng)))

        def jitter(t: Any) -> Any:
            return torch.from_numpy(perturb(t.detach().cpu().double().numpy(), rng)) if t.is_floating_point() else t

        return _run(twin, _map_tensors(inputs, jitter), device, torch.float64).quantities()

    return Sensitivity(relative_changes(ref.quantities(), moved), canonical(spec))


def verify_torch_model(
    model: Any, example_inputs: Any, *, device: str = "cpu", paths: Sequence[str] | None = None
) -> list[PathOutcome]:
    """The outcome of every selected PyTorch path of ``device`` (:func:`model_paths`) for a torch model, each
    against the float64 run of the model on the device the paths run on."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"verify_model takes a torch.nn.Module or a Keras model, got {type(model).__name__}")
    if not recurrent_layers(model):
        raise ValueError(f"{type(model).__name__} has no recurrent layer (nn.LSTM, nn.GRU, nn.RNN or a cell)")
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    info = resolve_device(device, "device")
    selected = model_paths(info.kind, paths)
    if not selected:
        raise ValueError(f"no PyTorch path for {info.name} in {paths!r} (see `lstmperf paths`)")
    # the reference runs where the paths run: a model that makes tensors on its device (a first hidden state on
    # the tutorial's global ``device``) runs there, and float64 on a GPU is as exact as on the CPU for every
    # bound used (the tightest, fp32 forward, is about 1e-7; float64 errs about 1e-16 per operation)
    where = info.torch_device
    try:
        ref = _run(model, inputs, where, torch.float64)
    except Exception as exc:
        raise ValueError(f"the float64 reference run of {type(model).__name__} on {where} {_raised(exc)}") from exc
    if not ref.layer_shapes:
        raise ValueError(f"no recurrent layer of {type(model).__name__} ran on the example inputs")
    spec = envelope_spec(_per_layer(ref.layer_shapes))
    sensitivity = _sensitivity(model, inputs, ref, spec, where)
    return [_verify_path(model, inputs, info, path, ref, spec, sensitivity) for path in selected]


def _verify_path(
    model: Any, inputs: tuple[Any, ...], info: Any, path: Any, ref: ModelRun, spec: LayerSpec, sensitivity: Any = None
) -> PathOutcome:
    import torch

    outcome = PathOutcome(path.name)
    reason = path.available(info)
    if reason:
        outcome.skipped = reason
        return outcome
    try:
        run = _run(model, inputs, info.torch_device, torch.float32, path)
    except Exception as exc:  # the model cannot run this path: a failure of the path, with what happened
        text = f"the model, run on {info.torch_device} in float32 under this path's switches, {_raised(exc)}"
        outcome.mismatches = [Mismatch("error", "run", text)]
        outcome.report = format_failure(path.name, spec, SEED, outcome.mismatches)
        return outcome
    claims = [c for c in (call_claim(path, s) for s in ref.layer_shapes.values()) if c is not None]
    claim = claims[0] if claims else (path.kernel, path.precision)
    conclude(outcome, path, run, ref, claim, spec, sensitivity=sensitivity)
    return outcome


def _raised(exc: Exception) -> str:
    """``raised <type>: <first line>``, with what to change where the cause is a dtype fixed inside the model."""
    text = f"raised {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
    if "same device" in str(exc) or "Expected all tensors to be on the same device" in str(exc):
        text += (
            ". verify_model moves a copy of the model and its inputs to each run's device; a tensor the forward "
            "makes on a fixed device (torch.zeros(..., device=device) with a module-level device) stays there: "
            "make it on the input's device (device=input.device) or the parameters' "
            "(next(self.parameters()).device); a 1-D integer tensor given on the CPU stays there (sequence "
            "lengths, which pack_padded_sequence takes on the CPU only): give token ids on the model's device"
        )
    elif "dtype" in str(exc) or "scalar type" in str(exc):
        text += (
            ". verify_model casts the model's parameters and floating-point inputs to each path's dtype (float64 "
            "for the reference, float32 for the paths; tensors the model makes with no dtype follow it); a model "
            "that fixes a dtype in its forward (torch.zeros(..., dtype=torch.double), x.float()) runs in that "
            "dtype only: make them like the input (dtype=input.dtype, device=input.device)"
        )
    return text
