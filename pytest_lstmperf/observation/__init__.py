"""What actually ran: the kernel traces (``torch_trace``, ``tf_trace``; per torch layer call ``layer_trace``), the
observer of a user's own layer calls (``calls``), the explainer that says why a layer falls back (``explain``),
a user's model or config file read into layer configs (``model_configs``), the cuDNN eligibility report of a
model (``eligibility``), and what satisfies a claimed kernel or precision, with the known findings
(``claims``).

Named ``observation`` rather than ``observe`` because ``pytest_lstmperf.observe`` is a public function.
"""
