"""fusee against its peer, DBOS Transact, measured side by side.

W1-W3 and W5 of the issue "Performance: ten times the peers": each
repetition a fresh process on a fresh database, medians of 3 (1 in quick
mode). Prints one JSON line per figure: fusee's (SQLite fsync and memory),
DBOS's, and the ratio fusee fsync / DBOS. The harness is bench/peers/compare.py;
it installs DBOS into bench/.venv-dbos on first use. Until fusee's engine
exists, only DBOS's figures are printed ("fusee: not available" on stderr).

    python bench/peers_compare.py [--quick] [--repeat N] [--workloads W1,W2,W3]
                                  [--systems fusee,dbos] [-v]
    FUSEE_BENCH_QUICK=1 python bench/run.py peers_compare    # smoke test
"""

from __future__ import annotations

import sys

from peers.compare import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
