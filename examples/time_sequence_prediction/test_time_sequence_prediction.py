"""What a maintainer of the sine-wave model guards: its LSTMCell loop runs the kernels a cell has (PyTorch has no
cuDNN or oneDNN cell kernel: the native CPU kernels, the fused generic cell kernels on a GPU), its numbers agree
with a float64 run on the paths whose claim a cell meets, and the report says what moving to nn.LSTM would gain.
Run with ``pytest examples --device=cpu`` (or ``--device=cuda``)."""

import pytest
import torch
from sine_model import Sequence, sine_waves

import pytest_lstmperf

BATCH, LENGTH, FUTURE = 3, 12, 2

#: the paths whose claim a cell loop meets, per device (the oneDNN and cuDNN paths claim kernels cells lack)
CELL_PATHS = {"cpu": ["torch-cpu-native", "torch-cpu-native-autocast-bf16"], "cuda": ["torch-cuda-generic"]}


@pytest.fixture
def model(lstmperf_device):
    torch.manual_seed(0)
    return Sequence().to(lstmperf_device)


@pytest.fixture
def waves(lstmperf_device):
    return sine_waves(BATCH, LENGTH + 1, torch.Generator().manual_seed(1)).to(lstmperf_device)


@pytest.mark.lstmperf_kernel(cpu="cpu-native", cuda="cuda-generic")
def test_training_step_runs_the_cell_kernels(model, waves):
    prediction = model(waves[:, :-1])
    torch.nn.functional.mse_loss(prediction, waves[:, 1:]).backward()


def test_every_cell_path_matches_float64(model, waves, lstmperf_device):
    paths = CELL_PATHS[torch.device(lstmperf_device).type]
    # bf16 gradients: their bound would reach 0.1 relative error, accepted by name (else the call raises)
    outcomes = pytest_lstmperf.verify_model(
        model, (waves[:, :-1], FUTURE), device=lstmperf_device, paths=paths,
        accept_unchecked=["*-autocast-bf16: grad *"],
    )  # fmt: skip
    checked = [o for o in outcomes if o.skipped is None]
    assert checked and all(o.errors for o in checked)
    # 2 cells x (LENGTH + FUTURE) calls: every cell call observed
    assert all(len([t for t in o.traces if t.phase == "forward"]) == 2 * (LENGTH + FUTURE) for o in checked)


def test_the_oneDNN_claim_fails_once_per_cell_call(model, waves):
    (outcome,) = pytest_lstmperf.verify_model(
        model.cpu(), waves[:, :-1].cpu(), device="cpu", paths=["torch-cpu-onednn"], raise_on_failure=False
    )
    kernel = [m for m in outcome.mismatches if m.check == "kernel" and m.quantity.startswith("forward")]
    assert len(kernel) == 2 * LENGTH


def test_the_cells_are_reported_as_falling_back(model, waves):
    rows = pytest_lstmperf.report(model, waves[:, :-1], device="cuda")
    assert [row.layer for row in rows] == ["lstm1", "lstm2"]
    assert all(pytest_lstmperf.falls_back(row) for row in rows)
    assert [(row.verdict.spec.batch, row.verdict.spec.seq_len) for row in rows] == [(BATCH, LENGTH)] * 2
    assert "run the sequence through nn.LSTM(1, 51)" in rows[0].verdict.reasons[0].change
