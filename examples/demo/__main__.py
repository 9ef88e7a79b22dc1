"""``python -m examples.demo``."""

from __future__ import annotations

from examples.demo.cli import main

raise SystemExit(main())
