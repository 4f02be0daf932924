"""``python -m llmgym``: the same command line as the ``llmgym`` console script."""

import sys

from llmgym.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
