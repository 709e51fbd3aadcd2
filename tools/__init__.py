"""Developer tooling of this repository, run from a checkout (``python tools/NAME.py``); not installed with the
package (``pyproject.toml`` packages ``pytest_lstmperf`` only)."""
