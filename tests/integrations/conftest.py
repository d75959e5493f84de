"""The integration tests import their worker's constants (batch, sequence) by plain name."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
