"""The float64 reference of a user's torch recurrent layers, computed by the plugin's own numpy recurrence.

:func:`numpy_recurrence` replaces, for the duration of a block, the four entry points through which every
PyTorch LSTM/GRU computes (``torch._VF.lstm``, ``torch._VF.gru``, ``torch._VF.lstm_cell``,
``torch._VF.gru_cell``: what ``nn.LSTM``, ``nn.GRU``, ``nn.LSTMCell``, ``nn.GRUCell``, their subclasses and
Keras on the torch backend call) with autograd functions whose forward and backward are
:func:`pytest_lstmperf.model.reference.forward`/:func:`~pytest_lstmperf.model.reference.backward`, the numpy
recurrence the suites check every path against. ``verify_model`` runs its float64 reference of a torch model
inside it: a wrong recurrent kernel in torch (on every path, float64 included) is then not in the reference,
and the paths that run it fail. Dense and packed input (``batch_sizes``: the sequences run over their own
lengths, the reverse direction from each one's end), initial states, several layers, both directions,
projections and bias-free layers are covered; the layers around them (embeddings, convolutions, attention) run
in torch's float64 as before. Plain ``nn.RNN``/``nn.RNNCell`` (tanh/relu) keep torch's own kernel: the numpy
recurrence has no such cell.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..model import reference
from ..model.case import param_names
from ..model.spec import LayerSpec

#: the ``torch._VF`` functions replaced inside :func:`numpy_recurrence`
ENTRY_POINTS = ("lstm", "gru", "lstm_cell", "gru_cell")


def _np(t: Any) -> np.ndarray:
    out: np.ndarray = t.detach().to("cpu").double().numpy()
    return out


def _function() -> Any:
    import torch

    class NumpyRecurrence(torch.autograd.Function):
        """Forward and backward of one layer call by the numpy recurrence (float64)."""

        @staticmethod
        def forward(ctx: Any, spec: LayerSpec, x: Any, h0: Any, c0: Any, *weights: Any) -> Any:
            names = param_names(spec)
            w = {n: _np(t) for n, t in zip(names, weights, strict=True)}
            out, h_n, c_n = reference.forward(spec, w, _np(x), _np(h0), None if c0 is None else _np(c0))
            ctx.spec, ctx.device = spec, x.device
            ctx.save_for_backward(x, h0, *(() if c0 is None else (c0,)), *weights)

            def back(a: np.ndarray) -> Any:
                return torch.from_numpy(np.ascontiguousarray(a)).to(device=x.device, dtype=torch.float64)

            if c_n is None:
                return back(out), back(h_n)
            return back(out), back(h_n), back(c_n)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            spec: LayerSpec = ctx.spec
            saved = list(ctx.saved_tensors)
            x, h0 = saved[0], saved[1]
            c0 = saved[2] if spec.cell == "lstm" else None
            weights = saved[3:] if spec.cell == "lstm" else saved[2:]
            names = param_names(spec)
            w = {n: _np(t) for n, t in zip(names, weights, strict=True)}
            g_out, g_h = _np(grads[0]), _np(grads[1])
            g_c = _np(grads[2]) if spec.cell == "lstm" else None
            found = reference.backward(spec, w, _np(x), _np(h0), None if c0 is None else _np(c0), g_out, g_h, g_c)

            def back(a: np.ndarray) -> Any:
                return torch.from_numpy(np.ascontiguousarray(a)).to(device=ctx.device, dtype=torch.float64)

            return (None, back(found["x"]), back(found["h0"]),
                    back(found["c0"]) if c0 is not None else None, *(back(found[n]) for n in names))  # fmt: skip

    return NumpyRecurrence


def _spec(cell: str, x: Any, flat: list[Any], num_layers: int, bidirectional: bool, lengths: Any = None) -> LayerSpec:
    """The LayerSpec of one call from its batch-first input ``(B, T, I)`` and torch's flat weights (per layer
    and direction ``w_ih, w_hh[, b_ih, b_hh][, w_hr]``: 2 to 5 tensors, which says bias and projection)."""
    directions = 2 if bidirectional else 1
    per = len(flat) // (num_layers * directions)
    gates = 4 if cell == "lstm" else 3
    hidden = int(flat[1].shape[0]) // gates
    state = int(flat[1].shape[1])
    batch, seq_len, inputs = (int(n) for n in x.shape)
    return LayerSpec(
        cell=cell,  # type: ignore[arg-type]
        input_size=inputs,
        hidden_size=hidden,
        num_layers=num_layers,
        bidirectional=bidirectional,
        proj_size=state if per in (3, 5) else 0,
        bias=per >= 4,
        batch=batch,
        seq_len=seq_len,
        length_mode="packed" if lengths is not None else "none",
        lengths=lengths,
        initial_state=True,
    )


def _same_device(x: Any, *tensors: Any) -> None:
    """As torch's own kernel does: a hidden state or weight on another device than the input is an error that
    says so (the numpy recurrence would otherwise copy it across, or fail to copy it, without a word)."""
    for t in tensors:
        if t is not None and t.device != x.device:
            raise RuntimeError(
                f"Input and hidden tensors are not at the same device, found input tensor at {x.device} and "
                f"another tensor at {t.device}"
            )


def _layer(torch: Any, cell: str) -> Any:
    """The replacement of ``torch._VF.lstm``/``gru``: both overloads (dense and ``batch_sizes``)."""
    from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

    function = _function()

    def call(data: Any, second: Any, third: Any, *rest: Any) -> Any:
        packed = isinstance(second, torch.Tensor) and not second.is_floating_point()  # batch_sizes
        if packed:  # (data, batch_sizes, hx, flat_weights, bias, num_layers, dropout, train, bidirectional)
            batch_sizes, hx, flat = second, third, list(rest[0])
            num_layers, bidirectional, batch_first = int(rest[2]), bool(rest[5]), True
            x, lengths = pad_packed_sequence(PackedSequence(data, batch_sizes), batch_first=True)
            lengths_t: Any = tuple(int(n) for n in lengths)
        else:  # (input, hx, flat_weights, bias, num_layers, dropout, train, bidirectional, batch_first)
            hx, flat = second, list(third)
            num_layers, bidirectional, batch_first = int(rest[1]), bool(rest[4]), bool(rest[5])
            x = data if batch_first else data.transpose(0, 1)
            lengths_t = None
        h0, c0 = (hx[0], hx[1]) if cell == "lstm" else (hx, None)
        _same_device(x, h0, c0, *flat)
        spec = _spec(cell, x, flat, num_layers, bidirectional, lengths_t)
        results = function.apply(spec, x, h0, c0, *flat)
        out = results[0]
        if packed:
            out = pack_padded_sequence(out, torch.tensor(lengths_t), batch_first=True, enforce_sorted=True).data
        elif not batch_first:
            out = out.transpose(0, 1)
        return (out, *results[1:])

    return call


def _cell(torch: Any, cell: str) -> Any:
    """The replacement of ``torch._VF.lstm_cell``/``gru_cell``: one step of a one-layer layer."""
    function = _function()

    def call(x: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any = None, b_hh: Any = None) -> Any:
        flat = [w_ih, w_hh] + ([b_ih, b_hh] if b_ih is not None else [])
        h, c = (hx[0], hx[1]) if cell == "lstm" else (hx, None)
        _same_device(x, h, c, *flat)
        spec = _spec(cell, x.unsqueeze(1), flat, 1, False)
        results = function.apply(spec, x.unsqueeze(1), h.unsqueeze(0), None if c is None else c.unsqueeze(0), *flat)
        if cell == "lstm":
            return results[1][0], results[2][0]
        return results[1][0]

    return call


@contextlib.contextmanager
def numpy_recurrence() -> Iterator[None]:
    """Inside the block, every LSTM/GRU layer or cell call that goes through ``torch._VF`` computes (forward and
    backward, float64) by the numpy recurrence; the entry points are restored afterwards."""
    import torch

    vf = torch._VF
    own = {name: vf.__dict__[name] for name in ENTRY_POINTS if name in vf.__dict__}  # already patched (a test)
    replacements = {"lstm": _layer(torch, "lstm"), "gru": _layer(torch, "gru"),
                    "lstm_cell": _cell(torch, "lstm"), "gru_cell": _cell(torch, "gru")}  # fmt: skip
    try:
        for name, fn in replacements.items():
            setattr(vf, name, fn)
        yield
    finally:
        for name in ENTRY_POINTS:
            if name in own:
                setattr(vf, name, own[name])
            else:
                vf.__dict__.pop(name, None)
