"""``python -m hearthnet``: the ``hearthnet`` command."""

import sys

from hearthnet.cli import main

if __name__ == "__main__":
    sys.exit(main())
