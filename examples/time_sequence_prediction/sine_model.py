"""The ``Sequence`` model of pytorch/examples' time-sequence prediction (``time_sequence_prediction/train.py``;
BSD-3-Clause, Copyright (c) 2017 PyTorch contributors), written out here with the same structure: two
``nn.LSTMCell`` of 51 units stepped over the sequence, a linear read-out per step, and ``future`` steps fed
back from its own predictions. One change: the published forward makes its states with ``dtype=torch.double``
(it trains in float64); here they are made like the input (``dtype=input.dtype, device=input.device``), so
the model runs in whichever dtype and on whichever device it is given. Only the model part is used.
"""

import torch
import torch.nn as nn


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 51)
        self.lstm2 = nn.LSTMCell(51, 51)
        self.linear = nn.Linear(51, 1)

    def forward(self, input, future=0):
        outputs = []
        like = {"dtype": input.dtype, "device": input.device}
        h_t = torch.zeros(input.size(0), 51, **like)
        c_t = torch.zeros(input.size(0), 51, **like)
        h_t2 = torch.zeros(input.size(0), 51, **like)
        c_t2 = torch.zeros(input.size(0), 51, **like)

        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for _ in range(future):  # if we should predict the future
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        outputs = torch.cat(outputs, dim=1)
        return outputs


def sine_waves(batch, length, generator=None):
    """The published data: sin(x / 20) of shifted integer ramps (``generate_sine_wave.py``), as float32."""
    shifts = torch.randint(-80, 80, (batch, 1), generator=generator)
    x = torch.arange(length).unsqueeze(0) + shifts
    return torch.sin(x / 20.0).float()
