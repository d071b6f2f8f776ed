"""`python -m cli` runs the `hybrid` command."""

import sys

from cli.main import main

sys.exit(main())
