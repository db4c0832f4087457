"""`python -m seamkit.seams.pipeline` and `torchrun ... -m seamkit.seams.pipeline`: see seamkit/seams/pipeline/__init__.py."""

import sys

from seamkit.seams.pipeline.launch import main

if __name__ == "__main__":
    sys.exit(main())
