"""Each Keras path runs the kernel the explainer predicts, and the kernel the path claims.

For every Keras path of the selected device and a few specs (plain, GRU both forms, no bias, bidirectional
with a mask, stacked with initial states), the explainer's prediction (family and precision) must equal the
observed forward and backward traces. Kernel-only paths (``activation='relu'``, ``return_sequences=False``)
are checked here; their numbers are not compared with the reference (see ``paths/keras/support.py``). A path
that raises an error a known finding documents is an xfail naming it.
"""

from __future__ import annotations

import pytest

from pytest_lstmperf import paths as registry
from pytest_lstmperf.model.case import make_case
from pytest_lstmperf.model.spec import LayerSpec
from pytest_lstmperf.numerics.equivalence import conclude_known_findings, run_path
from pytest_lstmperf.observation.explain import context_for, explain

KERAS_PATHS = sorted(n for n, p in registry.all_paths().items() if p.framework.startswith("keras-"))

SPECS = [
    LayerSpec(cell="lstm", input_size=6, hidden_size=8, batch=3, seq_len=5),
    LayerSpec(cell="gru", input_size=6, hidden_size=8, batch=3, seq_len=5),
    LayerSpec(cell="gru", input_size=6, hidden_size=8, batch=3, seq_len=5, reset_after=False),
    LayerSpec(cell="lstm", input_size=6, hidden_size=8, batch=3, seq_len=5, bias=False),
    LayerSpec(cell="lstm", input_size=6, hidden_size=8, batch=3, seq_len=5, bidirectional=True,
              length_mode="packed", lengths=(5, 3, 1)),
    LayerSpec(cell="gru", input_size=6, hidden_size=8, num_layers=2, batch=3, seq_len=5, initial_state=True),
]  # fmt: skip


@pytest.mark.lstmperf_paths(*KERAS_PATHS)
def test_prediction_equals_observation(lstmperf_path, lstmperf, request) -> None:
    from pytest_lstmperf.paths.keras.support import supports_kernel

    path = lstmperf_path
    options = path.options["keras"]
    ran, mismatches = [], []
    for spec in SPECS:
        if supports_kernel(path, spec):
            continue
        verdict = explain(spec, path.framework, lstmperf.device, options, context=context_for(lstmperf.device))
        result = run_path(path, make_case(spec), lstmperf.device, request.node)
        if result is None:  # a documented error (a known finding): concluded below
            continue
        observed = [result.forward_trace] + ([result.backward_trace] if result.backward_trace else [])
        ran.append(spec.short())
        for trace in observed:
            if trace.family != verdict.kernel or trace.family != path.kernel:
                mismatches.append(
                    f"{spec.short()} [{options.short()}]: predicted {verdict.kernel}, path claims {path.kernel}, "
                    f"observed {trace.describe()}\n{verdict.describe()}"
                )
            elif trace.precision != verdict.precision:
                mismatches.append(
                    f"{spec.short()}: predicted precision {verdict.precision}, observed {trace.describe()}"
                )
    assert not mismatches, "\n".join(mismatches)
    conclude_known_findings(path, request.node, numbers=False)
    if not ran:
        pytest.skip(f"{path.name} supports none of this suite's specs")
