"""Suite-wide settings. Fixtures live in the conftest.py of each test folder.

Hypothesis profiles (pick one with GM_HYPOTHESIS_PROFILE, default ``ci``):
- ``ci``: 100 examples, no deadline (2 shared cores and server tests make timing
  noisy), and a reproduction blob printed with every failure.
- ``long``: 2,000 examples, for ``make test-long`` or a hunt for a rare failure.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", max_examples=100, deadline=None, print_blob=True)
settings.register_profile("long", max_examples=2_000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("GM_HYPOTHESIS_PROFILE", "ci"))
