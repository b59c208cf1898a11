"""`python -m blockviz` is the `blockviz` command."""

import sys

from blockviz.cli import main

sys.exit(main())
