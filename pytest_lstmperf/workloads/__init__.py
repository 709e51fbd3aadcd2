"""Workloads beyond a single layer call: variable-length batches (``varlen``), the CPU/GPU crossover sweep
(``crossover``), framework overhead (``overhead``), the wall-clock timing they share (``timing``), the workload
suite's report (``report``), and multi-process data- and model-parallel training (``distributed``: the
strategies; ``rank``: a rank process's entry point; ``launcher``: the ranks started under torch's elastic agent)."""
