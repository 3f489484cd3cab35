"""``python -m gnnfuse ...``: the command line, where the ``gnnfuse`` script is not on PATH."""
import sys

from .cli import main

if __name__ == "__main__":     # not when a spawned process imports this module as its main
    sys.exit(main())
