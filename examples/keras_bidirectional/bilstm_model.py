"""The model of keras-io's "Bidirectional LSTM on IMDB" example (``examples/nlp/bidirectional_lstm_imdb.py``,
Apache-2.0, by fchollet), written out here with the same layers: token ids -> Embedding(max_features, 128) ->
Bidirectional(LSTM(64, return_sequences=True)) -> Bidirectional(LSTM(64)) -> Dense(1, sigmoid). Only the model
part is used: no dataset is downloaded, the tests draw token ids locally. The sizes are parameters so that
the tests run small.
"""

import keras
from keras import layers


def build_model(max_features=20000, maxlen=200, embed_dim=128, units=64, batch_size=None):
    inputs = keras.Input(shape=(maxlen,), dtype="int32", batch_size=batch_size)
    x = layers.Embedding(max_features, embed_dim)(inputs)
    x = layers.Bidirectional(layers.LSTM(units, return_sequences=True))(x)
    x = layers.Bidirectional(layers.LSTM(units))(x)
    outputs = layers.Dense(1, activation="sigmoid")(x)
    return keras.Model(inputs, outputs)
