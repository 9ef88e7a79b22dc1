"""Trace assembly: spans grouped by trace id until the trace is complete enough to
sample and evaluate (:mod:`.assembler`), configured by the ``assembly`` section
(:mod:`.config`)."""
