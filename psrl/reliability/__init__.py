"""Reliability: fault plans and the run invariants checked from the event log."""
