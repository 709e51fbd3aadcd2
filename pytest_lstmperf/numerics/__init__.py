"""Numerical equivalence: the measured tolerance model (``tolerance``), the checks of an output against the
reference and of a trace against a claim (``checks``), the equivalence runs of the suites (``equivalence``) and the
check of a user's own model (``verify_model``). The constants are measured by the repository's
``tools/tolerance_calibration.py``, which is not installed."""
