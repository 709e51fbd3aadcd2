"""Observers: which kernel a layer actually ran (kernel traces per framework)."""
