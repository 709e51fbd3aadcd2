"""What a maintainer of the tutorial's translator guards: its GRUs run the device's kernel (cuDNN on a GPU; on
the CPU PyTorch has no oneDNN GRU, so the native kernels), every execution path agrees with a float64 run of
the model (which runs on the device the model made its tensors on), the decoder's one-token-per-call GRU is
reported as such, and a training step's speed is gated against the device's baseline.
Run with ``pytest examples --device=cpu`` (or ``--device=cuda`` on a GPU runner)."""

import pytest
import seq2seq_model
import torch
from seq2seq_model import MAX_LENGTH, AttnDecoderRNN, EncoderRNN, Translator

import pytest_lstmperf

IN_WORDS, OUT_WORDS, HIDDEN, BATCH, IN_LENGTH = 30, 25, 16, 3, 6


@pytest.fixture
def model(lstmperf_device):
    if torch.device(lstmperf_device).type != seq2seq_model.device.type:
        pytest.skip(f"the tutorial makes its decoder's first input on {seq2seq_model.device}; run on that device")
    torch.manual_seed(0)
    return Translator(EncoderRNN(IN_WORDS, HIDDEN), AttnDecoderRNN(HIDDEN, OUT_WORDS)).to(lstmperf_device)


@pytest.fixture
def pair(lstmperf_device):
    generator = torch.Generator().manual_seed(1)
    source = torch.randint(1, IN_WORDS, (BATCH, IN_LENGTH), generator=generator)
    target = torch.randint(1, OUT_WORDS, (BATCH, MAX_LENGTH), generator=generator)
    return source.to(lstmperf_device), target.to(lstmperf_device)


@pytest.mark.lstmperf_kernel(cpu="cpu-native", cuda="cudnn")
def test_training_step_runs_the_devices_gru_kernel(model, pair):
    source, target = pair
    output = model(source, target)
    torch.nn.functional.nll_loss(output.view(-1, OUT_WORDS), target.view(-1)).backward()


def test_every_path_matches_float64(model, pair, lstmperf_device):
    # accepted by name, else the call raises: the bf16 autocast gradients (their bound would reach 0.1 relative
    # error), and the attention's score bias, whose gradient is zero by construction (softmax ignores a shift
    # shared by every score: the float64 reference's is rounding noise, so no relative error means anything)
    accepted = ["*-autocast-bf16: grad *", "grad decoder.attention.Va.bias"]
    outcomes = pytest_lstmperf.verify_model(model, pair, device=lstmperf_device, accept_unchecked=accepted)
    checked = [o for o in outcomes if o.skipped is None]
    assert checked and all(o.ok and o.errors for o in checked)
    assert all(any(k.startswith("grad decoder.gru.weight_hh_l0") for k in o.errors) for o in checked)


def test_the_decoder_gru_is_reported_as_called_once_per_token(model, pair):
    rows = pytest_lstmperf.report(model, pair, device="cuda")
    by_layer = {row.layer: row for row in rows}
    assert set(by_layer) == {"encoder.gru", "decoder.gru"}
    assert not any(pytest_lstmperf.falls_back(row) for row in rows)  # both reach cuDNN on a GPU
    decoder = by_layer["decoder.gru"].verdict
    assert (decoder.spec.batch, decoder.spec.seq_len) == (BATCH, 1)
    assert any(f"called {MAX_LENGTH} times in one forward" in note for note in decoder.notes)


@pytest.mark.lstmperf("train")
def test_training_step_speed(benchmark, model, pair):
    source, target = pair

    def step():
        model.zero_grad(set_to_none=True)
        output = model(source, target)
        loss = torch.nn.functional.nll_loss(output.view(-1, OUT_WORDS), target.view(-1))
        loss.backward()
        return loss

    benchmark(step)
