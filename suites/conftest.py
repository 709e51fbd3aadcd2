"""The suites need nothing beyond the pytest-lstmperf plugin (installed through its pytest11 entry point)."""
