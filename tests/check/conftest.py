"""Lets the check tests import the helpers next to them (``pins``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
