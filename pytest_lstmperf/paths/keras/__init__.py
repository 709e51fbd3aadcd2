"""Keras 3 execution paths: what only one Keras backend needs lives in a module of its own here."""
