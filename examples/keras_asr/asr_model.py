"""The model of keras-io's "Automatic Speech Recognition using CTC" example (``examples/audio/ctc_asr.py``,
Apache-2.0, by Mohamed Reda Bouadjenek and Ngoc Dung Huynh), written out here with the same layers: a
spectrogram ``(time, input_dim)`` -> Reshape -> two Conv2D (11x41 stride 2x2, 11x21 stride 1x2, no bias) each with
BatchNormalization and ReLU -> Reshape to ``(time, features)`` -> ``rnn_layers`` x Bidirectional(GRU(rnn_units,
reset_after=True, return_sequences=True)) with Dropout(0.5) between them -> Dense(2 * rnn_units) + ReLU + Dropout ->
Dense(output_dim + 1, softmax) (DeepSpeech2-like). Only the model is used: no LJSpeech download, no CTC loss, no
optimizer; the sizes are parameters so that the tests run small, and ``time_steps`` may fix the time dimension the
original leaves open (``None``)."""

import keras
from keras import layers


def build_model(input_dim, output_dim, rnn_layers=5, rnn_units=128, time_steps=None, batch_size=None):
    """Model similar to DeepSpeech2."""
    # Model's input
    input_spectrogram = layers.Input((time_steps, input_dim), name="input", batch_size=batch_size)
    # Expand the dimension to use 2D CNN.
    x = layers.Reshape((-1, input_dim, 1), name="expand_dim")(input_spectrogram)
    # Convolution layer 1
    x = layers.Conv2D(
        filters=32,
        kernel_size=[11, 41],
        strides=[2, 2],
        padding="same",
        use_bias=False,
        name="conv_1",
    )(x)
    x = layers.BatchNormalization(name="conv_1_bn")(x)
    x = layers.ReLU(name="conv_1_relu")(x)
    # Convolution layer 2
    x = layers.Conv2D(
        filters=32,
        kernel_size=[11, 21],
        strides=[1, 2],
        padding="same",
        use_bias=False,
        name="conv_2",
    )(x)
    x = layers.BatchNormalization(name="conv_2_bn")(x)
    x = layers.ReLU(name="conv_2_relu")(x)
    # Reshape the resulted volume to feed the RNNs layers
    x = layers.Reshape((-1, x.shape[-2] * x.shape[-1]))(x)
    # RNN layers
    for i in range(1, rnn_layers + 1):
        recurrent = layers.GRU(
            units=rnn_units,
            activation="tanh",
            recurrent_activation="sigmoid",
            use_bias=True,
            return_sequences=True,
            reset_after=True,
            name=f"gru_{i}",
        )
        x = layers.Bidirectional(recurrent, name=f"bidirectional_{i}", merge_mode="concat")(x)
        if i < rnn_layers:
            x = layers.Dropout(rate=0.5)(x)
    # Dense layer
    x = layers.Dense(units=rnn_units * 2, name="dense_1")(x)
    x = layers.ReLU(name="dense_1_relu")(x)
    x = layers.Dropout(rate=0.5)(x)
    # Classification layer
    output = layers.Dense(units=output_dim + 1, activation="softmax")(x)
    # Model
    model = keras.Model(input_spectrogram, output, name="DeepSpeech_2")
    return model
