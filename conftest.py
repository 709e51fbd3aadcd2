"""Root conftest: the project's own tests run pytest in subprocesses through ``pytester``."""

pytest_plugins = ["pytester"]
