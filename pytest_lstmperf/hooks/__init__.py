"""pytest wiring: the plugins registered by :mod:`pytest_lstmperf.plugin` (benchmark fixtures and gate,
kernel marker, workload fixtures). Hooks, fixtures and markers live here; what they compute lives in the
layers below."""
