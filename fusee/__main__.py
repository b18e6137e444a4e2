"""``python -m fusee``: the ``fusee`` command (see `fusee.cli`)."""

from __future__ import annotations

import sys

from fusee.cli import main

if __name__ == "__main__":
    sys.exit(main())
