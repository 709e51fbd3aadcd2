"""Speed: the benchmark shapes (``shapes``), the clocks and the anchor (``timing``), one benchmark's measurement
(``runner``), hardware-keyed stored baselines (``baseline``), the gate's rule (``policy``), the run's decisions
(``gate``) and the speed report (``report``)."""
