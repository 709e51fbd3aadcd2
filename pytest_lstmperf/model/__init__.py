"""What is being tested: a layer's spec (and a Keras layer's KerasOptions), the concrete case (inputs, canonical
weights) built from it, the float64 reference that every path is compared against, and the Hypothesis strategies
that draw specs.

Imports no framework: torch is loaded inside the functions that need it.
"""
