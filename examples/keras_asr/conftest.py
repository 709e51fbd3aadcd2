"""Keras fixes its backend at its first import: these examples use the torch backend unless KERAS_BACKEND says
otherwise (both run on a CPU)."""

import os

os.environ.setdefault("KERAS_BACKEND", "torch")
