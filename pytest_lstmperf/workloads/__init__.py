"""Workloads beyond a single layer call: variable-length batches, crossover sweeps and overheads
(``workloads``), and multi-process data- and model-parallel training (``distributed``: the strategies; ``rank``:
a rank process's entry point; ``launcher``: the ranks started under torch's elastic agent)."""
