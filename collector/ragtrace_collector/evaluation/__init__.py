"""Online evaluation of assembled traces, in pipeline order:

* :mod:`.sampling`: which traces (or sessions) are evaluated, within budgets;
* :mod:`.case_builder` and :mod:`.case_bounds`: a trace's spans become cases, through
  the span conventions (:mod:`ragtrace_collector.conventions`), within size bounds;
* :mod:`.evaluator`: runs the metric suite on the cases, in process or in the worker
  pool of :mod:`.pool`;
* :mod:`.enrichment` and :mod:`.document_verdicts`: the results written onto the spans;
* :mod:`.stage`: the ``evaluation`` component that puts these together between
  assembly and the exporters;
* :mod:`.config`: the ``evaluation`` section.
"""
