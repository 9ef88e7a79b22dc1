"""The exit codes that mean the same in every ``ragtrace-collector`` command.

One kind of mistake gets one code, whichever command meets it:

* :data:`EXIT_USAGE` (2): nothing was done because of what the command was given.
  argparse exits 2 itself for a bad command line; ``serve --config``, ``check-config``
  and ``eval --config`` exit 2 for a configuration file that cannot be read, is not
  YAML, or is not a valid configuration (for ``serve`` and ``check-config``: any
  problem ``check-config`` reports); ``eval`` also exits 2 when a metric it was asked
  for needs a field that no row of the data has (nothing would be scored).

The other codes belong to each command: ``serve`` exits 1 when it cannot start for a
reason ``check-config`` does not check (a port that cannot be bound) and 3 when spans
were not delivered by the shutdown deadline; ``eval`` exits 1 for bad rows and 3 for a
failed quality gate.  docs/configuration.md and docs/offline-evaluation.md list them.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE"]

EXIT_OK: Final = 0
#: A bad command line, or a configuration file that cannot be read or is invalid.
EXIT_USAGE: Final = 2
#: Interrupted (SIGINT) before the command could stop on its own terms.
EXIT_INTERRUPTED: Final = 130
