"""Executors for programs: `reference` (torch ops, any device) and `triton` (generated kernels)."""
