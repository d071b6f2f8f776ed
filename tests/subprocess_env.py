"""The environment for a test's child process that imports the checkout."""

from __future__ import annotations

import os
from pathlib import Path


def with_checkout(root: Path) -> dict[str, str]:
    """os.environ with `root` first on PYTHONPATH, what was there kept after it (a machine
    whose packages are found through PYTHONPATH, as the GPU machine's carried wheels are)."""
    paths = [str(root), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
