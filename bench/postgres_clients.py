"""fusee on Postgres, runs started by a Client: `bench/postgres.py --clients`, a target of its own.

Run by name only (``python bench/run.py postgres_clients``): W2 embedded,
with 1 and 2 worker processes starting their own runs, and with 1 and 2
workers serving runs a `fusee.Client` starts and awaits, repetitions
interleaved in one run, with the Client's ratios (2 / 1 workers, embedded /
by a Client) and the machine's load at the start and the end. The full
`bench/postgres.py` (DBOS, takeovers) stays `make bench`'s.

    python bench/postgres_clients.py [--repeat N] [--workflows N]
"""

from __future__ import annotations

import sys

from postgres import main

if __name__ == "__main__":
    sys.argv[1:] = ["--clients", *sys.argv[1:]]
    main()
