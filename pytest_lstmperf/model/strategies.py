"""Hypothesis strategies for layer specs, bounded by the profiles of :mod:`.profiles`.

The strategies that need the layers above this one live there: the specs drawn for one execution path, within
the tolerance model's reach, in :mod:`pytest_lstmperf.numerics.path_specs`; the names of the registered paths,
:func:`pytest_lstmperf.paths.path_names`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hypothesis import strategies as st

from .profiles import PROFILES, Profile, ShapeBounds  # noqa: F401 - re-exported (they lived here)
from .spec import LayerSpec

if TYPE_CHECKING:
    from .spec import Cell, Lengths


@st.composite
def specs(
    draw: st.DrawFn,
    bounds: ShapeBounds,
    cells: tuple[Cell, ...] = ("lstm", "gru"),
    length_modes: tuple[Lengths, ...] = ("none", "none", "padded", "packed"),
    training: tuple[bool, ...] = (True, True, True, False),
    reset_after: tuple[bool, ...] = (True,),
) -> LayerSpec:
    """A valid LayerSpec within ``bounds``."""
    cell = draw(st.sampled_from(cells))
    hidden = draw(st.integers(1, bounds.max_hidden))
    proj = 0
    if cell == "lstm" and hidden > 1:
        proj = draw(st.sampled_from([0, 0, 0, draw(st.integers(1, hidden - 1))]))
    seq_len = draw(st.integers(1, bounds.max_seq))
    batch = draw(st.integers(1, bounds.max_batch))
    mode = draw(st.sampled_from(length_modes))
    lengths: tuple[int, ...] | None = None
    if mode != "none":
        drawn = list(draw(st.lists(st.integers(1, seq_len), min_size=batch, max_size=batch)))
        drawn[draw(st.integers(0, batch - 1))] = seq_len
        lengths = tuple(drawn)
    spec = LayerSpec(
        cell=cell,
        input_size=draw(st.integers(1, bounds.max_input)),
        hidden_size=hidden,
        num_layers=draw(st.integers(1, bounds.max_layers)),
        bidirectional=draw(st.booleans()),
        proj_size=proj,
        bias=draw(st.sampled_from([True, True, True, False])),
        batch_first=draw(st.booleans()),
        batch=batch,
        seq_len=seq_len,
        length_mode=mode,
        lengths=lengths,
        training=draw(st.sampled_from(training)),
        initial_state=draw(st.booleans()),
        reset_after=draw(st.sampled_from(reset_after)) if cell == "gru" else True,
    )
    # shrink the batch and sequence until the example fits, rather than rejecting it
    while not bounds.fits(spec) and (spec.batch > 1 or spec.seq_len > 1):
        t, b = spec.seq_len, spec.batch
        if t >= b and t > 1:
            t //= 2
        else:
            b //= 2
        lens = None
        if spec.lengths is not None:
            lens = [min(n, t) for n in spec.lengths[:b]]
            lens[0] = t  # the longest sequence defines seq_len
        spec = spec.replace(seq_len=t, batch=b, lengths=None if lens is None else tuple(lens))
    return spec


# ------------------------------------------------------------------------------------------ public strategies
def layer_specs(profile: str = "ci", cells: tuple[Cell, ...] = ("lstm", "gru")) -> st.SearchStrategy[LayerSpec]:
    """LayerSpecs within a profile's bounds (``ci``, ``gpu``, ``nightly``), for a user's parametrised tests."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r} (valid: {', '.join(PROFILES)})")
    return specs(PROFILES[profile].bounds, cells=cells)


def lstm_configs(
    profile: str = "ci", cells: tuple[Cell, ...] = ("lstm", "gru")
) -> st.SearchStrategy[dict[str, object]]:
    """Keyword arguments of ``torch.nn.LSTM``/``GRU`` (plus ``cell``, ``batch``, ``seq_len``) within a profile."""

    def to_kwargs(spec: LayerSpec) -> dict[str, object]:
        return {"cell": spec.cell, **spec.module_kwargs(), "batch": spec.batch, "seq_len": spec.seq_len}

    return layer_specs(profile, cells).map(to_kwargs)


def devices(include_unusable: bool = False) -> st.SearchStrategy[str]:
    """``"cpu"``, and ``"cuda"`` where torch sees a GPU (or always, with ``include_unusable``)."""
    found = ["cpu"]
    if include_unusable:
        found.append("cuda")
    else:
        import importlib.util

        if importlib.util.find_spec("torch") is not None:
            import torch

            if torch.cuda.is_available():
                found.append("cuda")
    return st.sampled_from(found)
