"""``python -m shuffled`` is the ``shuffled`` command."""

import sys

from shuffled.cli import main

sys.exit(main())
