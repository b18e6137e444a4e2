"""Runnable programs, each a `python examples/NAME.py` away and each tested (tests/examples/)."""
