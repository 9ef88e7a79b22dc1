"""``python -m examples.support_bot``."""

from __future__ import annotations

import sys

from examples.support_bot.cli import main

sys.exit(main())
