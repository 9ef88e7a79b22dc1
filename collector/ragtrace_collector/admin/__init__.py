"""The admin port: ``/metrics``, ``/healthz`` and ``/readyz`` (:mod:`.server`), and the
``admin`` section (:mod:`.config`)."""
