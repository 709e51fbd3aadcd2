"""The recurrent core of pytorch-forecasting's DeepAR (sktime/pytorch-forecasting 1.8.0,
``pytorch_forecasting/models/deepar/_deepar.py`` and ``pytorch_forecasting/models/nn/rnn.py``; MIT licence,
Copyright (c) 2020 Jan Beitner and the pytorch-forecasting contributors), written out here with the same
structure: the library's ``LSTM`` (an ``nn.LSTM`` whose forward takes ``lengths=`` and packs the padded batch
itself with ``pack_padded_sequence(..., enforce_sorted=False)``, a zero length run as one step), a 2-layer LSTM
that encodes the history (``encode``: the target lagged by one step, lengths ``encoder_lengths - 1``) and, in
training, decodes the whole horizon in one more packed call from the encoder's state (``decode_all``), then the
distribution projector (a Linear to the Normal's loc and scale). pytorch-forecasting itself is not a dependency
(it brings lightning, pandas and scikit-learn along); the dataset, the embeddings and the scaling of the
original are left out: the inputs are the continuous encoder/decoder features it builds.
"""

import torch
from torch import nn
from torch.nn.utils import rnn


class LSTM(nn.LSTM):
    """pytorch-forecasting's LSTM that can handle zero-length sequences (``models/nn/rnn.py``: ``RNN.forward``
    and ``LSTM``)."""

    def handle_no_encoding(self, hidden_state, no_encoding, initial_hidden_state):
        hidden, cell = hidden_state
        hidden = hidden.masked_scatter(no_encoding, initial_hidden_state[0])
        cell = cell.masked_scatter(no_encoding, initial_hidden_state[0])
        return hidden, cell

    def init_hidden_state(self, x):
        num_directions = 2 if self.bidirectional else 1
        batch_size = x.size(0) if self.batch_first else x.size(1)
        shape = (self.num_layers * num_directions, batch_size, self.hidden_size)
        return torch.zeros(shape, device=x.device, dtype=x.dtype), torch.zeros(shape, device=x.device, dtype=x.dtype)

    def forward(self, x, hx=None, lengths=None, enforce_sorted=True):
        if isinstance(x, rnn.PackedSequence) or lengths is None:
            assert lengths is None, "cannot combine x of type PackedSequence with lengths argument"
            return super().forward(x, hx=hx)
        min_length = lengths.min()
        max_length = lengths.max()
        assert min_length >= 0, "sequence lengths must be great equals 0"
        if max_length == 0:
            hidden_state = self.init_hidden_state(x)
            if self.batch_first:
                out = torch.zeros(lengths.size(0), x.size(1), self.hidden_size, dtype=x.dtype, device=x.device)
            else:
                out = torch.zeros(x.size(0), lengths.size(0), self.hidden_size, dtype=x.dtype, device=x.device)
            return out, hidden_state
        pack_lengths = lengths.where(lengths > 0, torch.ones_like(lengths))
        packed_out, hidden_state = super().forward(
            rnn.pack_padded_sequence(
                x, pack_lengths.cpu(), enforce_sorted=enforce_sorted, batch_first=self.batch_first
            ),
            hx=hx,
        )
        if min_length == 0:
            no_encoding = (lengths == 0)[None, :, None]
            initial_hidden_state = self.init_hidden_state(x) if hx is None else hx
            hidden_state = self.handle_no_encoding(hidden_state, no_encoding, initial_hidden_state)
        out, _ = rnn.pad_packed_sequence(packed_out, batch_first=self.batch_first)
        return out, hidden_state


class DeepAR(nn.Module):
    """DeepAR's network in training mode: ``forward(encoder_cont, encoder_lengths, decoder_cont,
    decoder_lengths)`` returns the Normal's (loc, scale) for every decoder step, as ``DeepAR.forward`` does
    with ``n_samples=None`` (teacher forcing: the lagged target is an input of the decoder)."""

    def __init__(self, n_features, hidden_size=10, rnn_layers=2, dropout=0.1, target_position=0):
        super().__init__()
        self.target_position = target_position
        self.rnn = LSTM(
            input_size=n_features,
            hidden_size=hidden_size,
            num_layers=rnn_layers,
            dropout=dropout if rnn_layers > 1 else 0,
            batch_first=True,
        )
        self.distribution_projector = nn.Linear(hidden_size, 2)

    @property
    def target_positions(self):
        # as pytorch-forecasting's property: the target's position among the features, on the model's device
        return torch.tensor([self.target_position], device=self.distribution_projector.weight.device)

    def construct_input_vector(self, x_cont, one_off_target=None):
        input_vector = x_cont.clone()
        # shift target by one
        input_vector[..., self.target_positions] = torch.roll(
            input_vector[..., self.target_positions], shifts=1, dims=1
        )
        if one_off_target is not None:  # set first target input (which is rolled over)
            input_vector[:, 0, self.target_positions] = one_off_target
        else:
            input_vector = input_vector[:, 1:]
        return input_vector

    def encode(self, encoder_cont, encoder_lengths):
        assert encoder_lengths.min() > 0
        encoder_lengths = encoder_lengths - 1
        input_vector = self.construct_input_vector(encoder_cont)
        _, hidden_state = self.rnn(input_vector, lengths=encoder_lengths, enforce_sorted=False)
        return hidden_state

    def decode_all(self, x, hidden_state, lengths=None):
        decoder_output, hidden_state = self.rnn(x, hidden_state, lengths=lengths, enforce_sorted=False)
        return self.distribution_projector(decoder_output), hidden_state

    def forward(self, encoder_cont, encoder_lengths, decoder_cont, decoder_lengths):
        hidden_state = self.encode(encoder_cont, encoder_lengths)
        # the last encoder target of every series, at its own length
        rows = torch.arange(encoder_cont.size(0), device=encoder_cont.device)
        one_off_target = encoder_cont[rows, encoder_lengths - 1, self.target_positions.unsqueeze(-1)].T
        input_vector = self.construct_input_vector(decoder_cont, one_off_target)
        output, _ = self.decode_all(input_vector, hidden_state, lengths=decoder_lengths)
        loc, scale = output[..., 0], nn.functional.softplus(output[..., 1])
        return loc, scale
