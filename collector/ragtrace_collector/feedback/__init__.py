"""User feedback: reading it from the span stream, joining it to the scores, and
measuring how well each metric predicts it.

* :mod:`.record`: one :class:`~.record.Feedback`, read from (or written as) a
  ``ragtrace.feedback`` span;
* :mod:`.config`: the ``feedback:`` section;
* :mod:`.join`: the join of feedback to the scores of its request, per trace id: its
  semantics, bounds and store interface; the backends in :mod:`.memory` (in this
  process, kept in SQLite with storage on) and :mod:`.redisjoin` (shared by replicas);
* :mod:`.tracker`: sliding windows of joined (score, feedback) pairs and their
  agreement figures (AUROC, its interval, Cohen's kappa);
* :mod:`.stage`: :class:`~.stage.FeedbackStage`, which puts them together: an
  evaluator result listener, ``record()`` for each feedback, ``report()`` for
  ``GET /feedback``, and the ``ragtrace_feedback_*`` series.
"""
