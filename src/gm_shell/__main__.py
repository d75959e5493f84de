"""``python -m gm_shell`` runs the ``gm`` command line."""

import sys

from gm_shell.cli import main

sys.exit(main())
