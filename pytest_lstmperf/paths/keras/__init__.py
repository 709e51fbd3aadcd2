"""Keras 3 execution paths.

``layer`` builds the Keras stack a spec describes, ``weights`` converts the canonical weights to Keras layouts,
``paths`` registers the paths. The layers run in a worker process per Keras backend: ``pool`` starts and talks
to the workers, ``transport`` frames their pipe, ``server`` is the worker's loop, ``runners`` holds a run in one
process with one runner module per backend (``tensorflow_runner``, ``torch_runner``, ``jax_runner``).
"""
