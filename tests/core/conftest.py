"""The core tests' shared helper module (``fast_cluster``) is imported by plain name."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
