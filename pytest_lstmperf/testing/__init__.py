"""Helpers for testing the plugin's own checks: :mod:`.faults` plants the faults they must catch."""
