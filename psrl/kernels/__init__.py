"""Fused CPU kernels (C, compiled on first use) for the embedded engine's decode step and sampling."""
