"""The kernel every component builds on; it knows no component.

* :mod:`.lifecycle`: the component lifecycle and status (:class:`Component`,
  :class:`Status`), the host that answers health from them (:class:`ComponentHost`),
  and the task supervisor (:class:`Supervisor`);
* :mod:`.consumer`: what a receiver hands its requests to (:class:`.consumer.TraceConsumer`)
  and how it is refused (:class:`.consumer.Refused`);
* :mod:`.telemetry`: the collector's own Prometheus metrics;
* :mod:`.logs`, :mod:`.lazylog`, :mod:`.redaction`: structured logs with secrets
  removed; :mod:`.config`: the ``logging`` section.

Every stage (receivers, storage, assembly, evaluation, exporters, stores, judges,
alerts) imports from here; this package imports none of them
(``tests/layout/test_imports.py`` keeps it so).
"""

from ragtrace_collector.component.lifecycle import Component, ComponentHost, Status, Supervisor

__all__ = ["Component", "ComponentHost", "Status", "Supervisor"]
