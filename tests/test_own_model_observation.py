"""What the kernel marker and the explainer say about a user's torch model: building a module is not a layer
call, cell calls are listed with the shapes they ran, the CPU's question is oneDNN (not cuDNN), and the torch
rules are checked against the installed release instead of carrying a standing warning."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_lstmperf.hooks.kernel_marker import verdict_problem  # noqa: E402
from pytest_lstmperf.model.spec import LayerSpec  # noqa: E402
from pytest_lstmperf.observation import explain as explainer  # noqa: E402
from pytest_lstmperf.observation.calls import observe  # noqa: E402


def test_building_a_module_and_flattening_its_weights_is_not_a_layer_call() -> None:
    """``nn.LSTM(...).to("cuda")`` inside a marked test runs ``_cudnn_rnn_flatten_weight`` outside any layer
    call (H100: "1 of 3 recurrent layer calls did not: forward: none/fp32 (ops: empty, uniform_, ...,
    _cudnn_rnn_flatten_weight) [outside any recurrent layer]"). The op reaches the observer on the CPU too
    (before torch finds no CPU kernel for it), so the build is planted here as it runs there."""
    with observe() as seen:
        lstm = torch.nn.LSTM(3, 4)
        with pytest.raises((NotImplementedError, RuntimeError)):  # no cuDNN here: the op is dispatched, then refused
            torch._cudnn_rnn_flatten_weight(list(lstm._flat_weights), 4, 3, 1, 4, 0, 1, False, False)
        lstm(torch.randn(5, 2, 3))
    assert "_cudnn_rnn_flatten_weight" in seen.recorder.loose.ops  # the planted build was observed
    assert verdict_problem(seen, "onednn") is None
    assert [t.detail for t in seen.all_traces()] == ["LSTM(3, 4)"]


def test_a_direct_recurrent_op_outside_any_module_still_counts() -> None:
    """The loose bucket still holds real recurrent work: the LSTM op called without a module (its oneDNN
    layer op is recorded outside any layer call, and judged)."""
    lstm = torch.nn.LSTM(3, 4)
    with observe() as seen:
        torch._VF.lstm(torch.randn(5, 2, 3), (torch.zeros(1, 2, 4),) * 2, lstm._flat_weights, True, 1, 0.0,
                       False, False, False)  # fmt: skip
    assert verdict_problem(seen, "onednn") is None
    problem = verdict_problem(seen, "cpu-native")
    assert problem is not None and "onednn/fp32" in problem and "[outside any recurrent layer]" in problem


class SineCells(torch.nn.Module):
    """pytorch/examples' time_sequence_prediction shape: two LSTMCells stepped over a batch-1 sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm1 = torch.nn.LSTMCell(1, 6)
        self.lstm2 = torch.nn.LSTMCell(6, 6)

    def forward(self, x):
        h1 = c1 = torch.zeros(x.size(0), 6, dtype=x.dtype)
        h2 = c2 = torch.zeros(x.size(0), 6, dtype=x.dtype)
        for step in x.split(1, dim=1):
            h1, c1 = self.lstm1(step, (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
        return h2


def test_seen_layers_lists_cell_calls_and_the_shapes_each_call_ran() -> None:
    gru = torch.nn.GRU(3, 5, batch_first=True)
    with observe() as seen:
        SineCells()(torch.randn(1, 4))
        gru(torch.randn(2, 9, 3), torch.zeros(1, 2, 5))
        gru(torch.randn(9, 3))  # unbatched
    cells = [spec for framework, spec, _ in seen.layers if framework == "torch-cell"]
    assert len(cells) == 8  # 4 steps x 2 cells
    assert {(s.batch, s.seq_len, s.initial_state, s.hidden_size) for s in cells} == {(1, 1, True, 6)}
    grus = [spec for framework, spec, _ in seen.layers if framework == "torch"]
    assert [(s.batch, s.seq_len, s.initial_state) for s in grus] == [(2, 9, True), (1, 9, False)]


def test_a_packed_call_is_described_with_its_lengths() -> None:
    lstm = torch.nn.LSTM(3, 4)
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.randn(6, 3, 3), [6, 4, 2])
    with observe() as seen:
        lstm(packed)
    ((_, spec, _),) = seen.layers
    assert (spec.batch, spec.seq_len, spec.length_mode, spec.lengths) == (3, 6, "packed", (6, 4, 2))


def test_a_cell_loop_failing_onednn_on_the_cpu_is_explained_without_cudnn() -> None:
    """A cell model claimed ``onednn`` on the CPU: the failure explains the cell (no cuDNN or oneDNN cell
    kernel, run the sequence through nn.LSTM), and nothing in it says to move to CUDA."""
    with observe() as seen:
        SineCells()(torch.randn(1, 3)).sum().backward()
    problem = verdict_problem(seen, "onednn")
    assert problem is not None and "7 of 7 recurrent layer calls did not" in problem
    assert "run the sequence through nn.LSTM(1, 6)" in problem and "nn.LSTMCell(6, 6)" in problem
    assert "CUDA tensor" not in problem and "move the module" not in problem and "to('cuda')" not in problem
    assert problem.count("explainer: ") == 2  # one line per distinct cell, not one per step


def test_explain_torch_on_the_cpu_asks_about_onednn() -> None:
    lstm = explainer.explain(LayerSpec(cell="lstm", input_size=8, hidden_size=16), "torch", "cpu")
    assert lstm.kernel == "onednn" and not lstm.reasons
    assert "runs oneDNN" in lstm.describe() and "CUDA tensor" not in lstm.describe()
    gru = explainer.explain(LayerSpec(cell="gru", input_size=8, hidden_size=16), "torch", "cpu")
    assert gru.kernel == "cpu-native" and [r.rule for r in gru.reasons] == ["torch_cpu_onednn"]
    assert "LSTM-only" in gru.reasons[0].finding
    proj = explainer.explain(LayerSpec(cell="lstm", input_size=8, hidden_size=16, proj_size=4), "torch", "cpu")
    assert proj.kernel == "cpu-native" and "proj_size=4 -> 0" in proj.reasons[0].change
    on_gpu = explainer.explain(LayerSpec(cell="lstm", input_size=8, hidden_size=16), "torch", "cuda")
    assert on_gpu.kernel == "cudnn" and not on_gpu.reasons


def test_torch_rules_are_checked_against_another_installed_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed torch other than the release the rules were read from: the rules are checked against it
    (tiny calls observed), and a verdict carries no note when they agree; a rule that disagrees (planted:
    every CPU LSTM predicted native) is named."""
    monkeypatch.setattr(explainer, "installed_versions", lambda: {"torch": "2.11.0", "keras": "3.15.1"})
    monkeypatch.setattr(explainer, "_RULES_CHECKS", {})
    spec = LayerSpec(cell="lstm", input_size=4, hidden_size=4)
    assert explainer.explain(spec, "torch", "cpu").notes == ()
    check = explainer.torch_rules_check()
    assert check.agrees and ("LSTM on cpu", "onednn", "onednn") in check.results
    monkeypatch.setattr(explainer, "_RULES_CHECKS", {})
    monkeypatch.setattr(explainer, "_torch_kernel", lambda spec, ctx, blocking: "cpu-native")
    (note,) = explainer.explain(spec, "torch", "cpu").notes
    assert "installed torch 2.11.0" in note and "LSTM on cpu: predicted cpu-native, ran onednn" in note


def test_the_rules_check_leaves_the_callers_observer_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(explainer, "installed_versions", lambda: {"torch": "2.11.0", "keras": "3.15.1"})
    monkeypatch.setattr(explainer, "_RULES_CHECKS", {})
    with observe() as seen:
        explainer.explain(LayerSpec(cell="lstm", input_size=4, hidden_size=4), "torch", "cpu")
    assert seen.layers == [] and seen.all_traces() == []
