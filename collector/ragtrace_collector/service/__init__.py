"""The running collector process, at the top: it builds every stage from the
configuration, wires them into the pipeline, starts them in order and stops them.
Nothing in the collector imports it but the command line (:mod:`ragtrace_collector.cli`).

* :mod:`.server`: ``ragtrace-collector serve``: builds the components from the config,
  starts them in order and shuts them down on SIGTERM;
* :mod:`.stages`: the evaluation stage (and its drop detector) built from the config;
* :mod:`.pipeline`: the path a request takes from a receiver through storage and
  assembly to the exporters;
* :mod:`.looplag`: event loop lag;
* :mod:`.ports`, :mod:`.preflight`: start-up checks (``check-config``).

What every component builds on (lifecycle, status, supervisor, telemetry, logs) is
the kernel, :mod:`ragtrace_collector.component`; the admin port is
:mod:`ragtrace_collector.admin`.
"""
