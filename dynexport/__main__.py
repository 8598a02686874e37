"""``python -m dynexport``: the same command line as the ``dynexport`` script."""

import sys

from dynexport.cli import main

sys.exit(main())
