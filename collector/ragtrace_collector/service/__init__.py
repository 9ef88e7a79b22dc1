"""The running collector process: what starts, wires, watches and stops the pipeline.

* :mod:`.server`: ``ragtrace-collector serve``: builds the components from the config,
  starts them in order and shuts them down on SIGTERM;
* :mod:`.pipeline`: the path a request takes from a receiver through storage and
  assembly to the exporters;
* :mod:`.component`: the component lifecycle and status, and the task supervisor;
* :mod:`.admin`: the admin port (``/healthz``, ``/readyz``, ``/metrics``);
* :mod:`.telemetry`: the collector's own Prometheus metrics; :mod:`.looplag`: event
  loop lag; :mod:`.logs`, :mod:`.lazylog`, :mod:`.redaction`: structured logs with
  secrets removed;
* :mod:`.ports`, :mod:`.preflight`: start-up checks (``check-config``);
* :mod:`.config`: the ``admin``, ``logging`` and ``shutdown`` sections.
"""
