"""What a maintainer of the chatbot tutorial's seq2seq model guards: its GRUs run the device's kernel (cuDNN on a
GPU; on the CPU PyTorch has no oneDNN GRU, so the native kernels), the encoder runs packed over each sentence's
own length (a dropped ``pack_padded_sequence`` or wrong lengths would let padding change the encoder's final
state, which seeds the decoder), every execution path agrees with a float64 run whose GRUs are computed by the
plugin's own recurrence, and the decoder's one-word-per-call GRU is reported as such.
Run with ``pytest examples --device=cpu`` (or ``--device=cuda`` on a GPU runner)."""

import pytest
import torch
from chatbot_model import ChatbotStep, EncoderRNN, LuongAttnDecoderRNN

import pytest_lstmperf

WORDS, HIDDEN, LAYERS = 20, 16, 2
#: the batch sorted by length, longest first, as the tutorial's batch2TrainData sorts it
LENGTHS = [7, 6, 4, 2]
TARGET_LENGTH = 5


@pytest.fixture
def model(lstmperf_device):
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(WORDS, HIDDEN)
    encoder = EncoderRNN(HIDDEN, embedding, LAYERS, dropout=0.1)
    decoder = LuongAttnDecoderRNN("dot", embedding, HIDDEN, WORDS, LAYERS, dropout=0.1)
    return ChatbotStep(encoder, decoder).to(lstmperf_device)


@pytest.fixture
def batch(lstmperf_device):
    """Time-major word ids padded with 0 past each sentence's length, the lengths on the CPU (as the tutorial's
    ``train`` keeps them), the target words."""
    generator = torch.Generator().manual_seed(1)
    source = torch.randint(2, WORDS, (max(LENGTHS), len(LENGTHS)), generator=generator)
    for column, length in enumerate(LENGTHS):
        source[length:, column] = 0
    target = torch.randint(2, WORDS, (TARGET_LENGTH, len(LENGTHS)), generator=generator)
    return source.to(lstmperf_device), torch.tensor(LENGTHS), target.to(lstmperf_device)


@pytest.mark.lstmperf_kernel(cpu="cpu-native", cuda="cudnn")
def test_training_step_runs_the_devices_gru_kernel(model, batch):
    source, lengths, target = batch
    probabilities = model(source, lengths, target)
    torch.log(probabilities.gather(2, target.unsqueeze(2))).mean().neg().backward()


def test_encoder_runs_packed_over_each_sentences_length(model, batch):
    rows = {row.layer: row for row in pytest_lstmperf.report(model, batch, device="cuda")}
    assert set(rows) == {"encoder.gru", "decoder.gru"}
    encoder = rows["encoder.gru"].verdict.spec
    assert encoder.length_mode == "packed", f"the encoder's GRU ran {encoder.short()}, not packed"
    assert (encoder.batch, encoder.seq_len, encoder.lengths) == (len(LENGTHS), max(LENGTHS), tuple(LENGTHS))
    assert encoder.bidirectional and encoder.num_layers == LAYERS
    assert not any(pytest_lstmperf.falls_back(row) for row in rows.values())  # both reach cuDNN on a GPU


def test_the_decoder_gru_is_reported_as_called_once_per_word(model, batch):
    decoder = next(row for row in pytest_lstmperf.report(model, batch) if row.layer == "decoder.gru").verdict
    assert (decoder.spec.batch, decoder.spec.seq_len, decoder.spec.length_mode) == (len(LENGTHS), 1, "none")
    assert any(f"called {TARGET_LENGTH} times in one forward" in note for note in decoder.notes)


def test_every_path_matches_float64(model, batch, lstmperf_device):
    # accepted by name, else the call raises: the bf16 autocast gradients (their bound would reach 0.1 relative
    # error)
    outcomes = pytest_lstmperf.verify_model(
        model, batch, device=lstmperf_device, accept_unchecked=["*-autocast-bf16: grad *"]
    )
    checked = [o for o in outcomes if o.skipped is None]
    assert checked and all(o.ok and o.errors for o in checked)
    assert all("grad encoder.gru.weight_hh_l1_reverse" in o.errors for o in checked)
