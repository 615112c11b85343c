"""Launching and supervising a run's actor processes, on one machine or across hosts."""
