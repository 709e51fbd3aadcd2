"""Keras 3 execution paths: the layer built from a spec (``layer``), canonical weights in Keras layouts
(``weights``), the worker process that runs a Keras backend outside the pytest process (``worker``), and the
registered paths themselves (``paths``)."""
