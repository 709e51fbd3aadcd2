"""Helpers for testing the plugin's own checks: :mod:`.faults` plants the faults they must catch, and
:mod:`.rank_faults` plants one in the distributed ranks only. The rest of the package imports nothing from here."""
