"""The peer benchmark: fusee and DBOS Transact measured side by side.

`compare.py` is the harness (run it through `bench/peers_compare.py`);
`fusee_workloads.py` and `dbos_workloads.py` are the two sides, each run as
its own process in its own virtualenv; `_common.py` is what they share.

The rule: nothing in this package imports fusee or dbos at import time, and
the harness imports neither at all, so a missing engine or peer can only
cost its own figures.
"""
