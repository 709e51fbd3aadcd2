"""What a maintainer of DeepAR's network guards: its LSTM packs the history and the horizon over each series' own
length (``enforce_sorted=False``: the batch in the data loader's order), the packed calls run what PyTorch runs
for packed input (the native kernels on the CPU, never oneDNN; cuDNN on a GPU), every execution path agrees with a
float64 run whose LSTM is computed by the plugin's own recurrence, and the report shows the encoder's and the
decoder's calls with their own shapes. Run with ``pytest examples --device=cpu`` (or ``--device=cuda``)."""

import pytest
import torch
from deepar_model import DeepAR

import pytest_lstmperf

FEATURES, HIDDEN, LAYERS = 3, 10, 2
#: encoder lengths (the history of each series, unsorted: the loader's order) and decoder lengths (the horizon)
ENCODER_LENGTHS = [13, 9, 11, 5, 13]
DECODER_LENGTHS = [4, 4, 2, 3, 4]


@pytest.fixture
def model(lstmperf_device):
    torch.manual_seed(0)
    return DeepAR(FEATURES, hidden_size=HIDDEN, rnn_layers=LAYERS, dropout=0.1).to(lstmperf_device)


@pytest.fixture
def batch(lstmperf_device):
    generator = torch.Generator().manual_seed(1)
    encoder = torch.randn(len(ENCODER_LENGTHS), max(ENCODER_LENGTHS), FEATURES, generator=generator)
    decoder = torch.randn(len(DECODER_LENGTHS), max(DECODER_LENGTHS), FEATURES, generator=generator)
    lengths = torch.tensor(ENCODER_LENGTHS), torch.tensor(DECODER_LENGTHS)
    # on the model's device, as pytorch-forecasting's batches are: its LSTM moves the lengths to the CPU to pack
    return tuple(t.to(lstmperf_device) for t in (encoder, lengths[0], decoder, lengths[1]))


def test_history_and_horizon_run_packed_over_each_series_length(model, batch):
    rows = pytest_lstmperf.report(model, batch, device="cuda")
    assert [row.layer for row in rows] == ["rnn", "rnn [call 2]"], [row.config for row in rows]
    encoder, decoder = (row.verdict.spec for row in rows)
    assert encoder.length_mode == decoder.length_mode == "packed", [encoder.short(), decoder.short()]
    # DeepAR encodes lengths - 1 steps (the target lagged by one), in the batch's own order
    assert encoder.lengths == tuple(n - 1 for n in ENCODER_LENGTHS) and encoder.seq_len == max(ENCODER_LENGTHS) - 1
    assert decoder.lengths == tuple(DECODER_LENGTHS) and decoder.seq_len == max(DECODER_LENGTHS)
    assert not any("pass the whole sequence" in note for row in rows for note in row.verdict.notes)
    assert not any(pytest_lstmperf.falls_back(row) for row in rows)  # packed input runs cuDNN on a GPU


def test_every_path_matches_float64(model, batch, lstmperf_device):
    # the packed calls are judged per call: on the oneDNN paths they claim the native kernels, as PyTorch runs
    # packed input of several lengths there (the suites' torch-cpu-packed path)
    outcomes = pytest_lstmperf.verify_model(
        model, batch, device=lstmperf_device, accept_unchecked=["*-autocast-bf16: grad *"]
    )
    checked = [o for o in outcomes if o.skipped is None]
    assert checked and all(o.ok and o.errors for o in checked)
    assert all("grad rnn.weight_hh_l1" in o.errors for o in checked)
