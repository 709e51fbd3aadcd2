"""Workloads beyond a single layer call: variable-length batches, crossover sweeps and overheads
(``workloads``), and multi-process data-parallel scaling (``distributed``)."""
