"""ggtools.runtime: CPU runtime for target + DFlash drafter pairs (numpy + numba)."""
