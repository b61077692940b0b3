"""The engine: the six use cases against small ports. Pure Python, no I/O of its own."""
