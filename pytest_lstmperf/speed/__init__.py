"""Speed: the benchmark shapes (``shapes``), the clocks and timers (``timing``), device-keyed stored baselines
(``baseline``), the regression decision (``regression``) and the speed report (``report``)."""
