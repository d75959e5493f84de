"""gm_core: the pure protocol core of gm (no I/O, no clock, no unseeded randomness)."""
