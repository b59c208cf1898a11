"""`python -m blockviz` is the `blockviz` command."""

import sys

from blockviz.cli import main

if __name__ == "__main__":  # the live engine's process (spawned) imports this module too
    sys.exit(main())
