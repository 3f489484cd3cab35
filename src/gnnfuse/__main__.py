"""``python -m gnnfuse ...``: the command line, where the ``gnnfuse`` script is not on PATH."""
import sys

from .cli import main

sys.exit(main())
