"""`python -m seamkit.dist` and `torchrun ... -m seamkit.dist`: see seamkit/dist/__init__.py."""

import sys

from .launch import main

if __name__ == "__main__":
    sys.exit(main())
