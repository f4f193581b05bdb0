"""``python -m oasis_sim`` / ``oasis-sim``: see ``oasis_sim.cli``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
