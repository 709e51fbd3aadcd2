"""Speed: the benchmark shapes (``shapes``), the clocks and the anchor (``timing``), one benchmark's measurement
(``runner``), time-per-call figures timed across the run's end (``sweep``), the typed records and their JSON
(``records``), hardware-keyed stored baselines (``baseline``, ``baseline_file``), the gate's rule (``policy``), the
run's decisions (``gate``), the speed report (``report``), the machine lock under pytest-xdist (``machine_lock``),
the machine-info thread (``machine_info``), provenance (``provenance``), and the one module that reaches into
pytest-benchmark beyond its public surface (``benchmark_adapter``)."""
