"""The write-ahead log and the ledger of outputs checked against a reference model on
generated sequences (issue 27, item 3).  The machine, its level (``Storage`` through its
public API, the test playing the pipeline's part) and its determinism are described in
:mod:`tests.storage.model`; ``benchmarks/storage_model.py`` runs it for minutes.

Invariants, after every step (each profile checks some, with the faults they need):

* ``delivered``: after the final replay (the machine's teardown: faults cleared, the
  log reopened, every exporter delivers everything), every acknowledged request and
  every logged carrier has reached every exporter, except those in damaged records
  (which the replay must count as skipped);
* ``holds``: no result computed in a process stays unlogged (a hold that never ends);
* ``clean_restart``: after a clean stop, nothing an exporter had is sent to it again,
  and no request with a logged result is judged again;
* ``checkpoint``: the checkpoint on disk never passes a record still needed;
* ``disk_bound``: the segments on disk stay within ``max_size`` plus one segment.

What it found on the code of 2026-11-27 (before the rework of ``storage/service.py``),
as the shortest sequences (the calls Hypothesis prints).  ``_SEQUENCES`` below plays
each one, and a control that differs in one key step; since the rework, the keyed
record check and the fix of found 1 (``Storage.forwarded``), every one of them passes
(defects 4 and 6 once the model wrote outputs as the pipeline does: ``timeout=False``,
``room_for_output``; with the old pipeline's behaviour put back in the model they fail
again):

* defect 1 (the checkpoint passes unsettled entries after a replay that logs a carrier
  first), profile ``checkpoint``: ``start; append_request(200) x2; restart(clean,
  replay=stepwise); replay(records=1, judge_early=True); replay(records=1000);
  deliver(both, pick=1); restart(clean, ...)`` -> "checkpoint 3 passes entries still
  needed: [2]".  The carrier (seq 3) logged while entry 2 was not yet replayed is held
  before it; once entry 1 settles, the checkpoint jumps to 3.  Control: ``judge_early=False``.
* defect 3 (marks vanish with their segment), profile ``clean_restart``: ``start;
  append_request(120000) x2; deliver(a, pick=0); append_request(120000);
  deliver(both, pick=0); judge(pick=1, attach=span); restart(clean, replay=all)``
  -> "exporter a is sent entry 1 again after a clean restart".  The delivery mark of
  entry 1 is in entry 2's segment, deleted once entry 2 settles.  Control: no third
  request (the segment stays active, so it is not deleted).
* defect 4 (a hold that never ends), profile ``holds``: ``start; append_request(200);
  disk_stalls; judge(pick=0, attach=carrier); wait(11.0); disk_resumes(fails=True)``
  -> at the final replay "results computed for [1] are never logged: their holds never
  end".  Control: ``wait(0.5)`` (under the 10 s append timeout): the failed write is
  retried.
* defect 5 (forged records via resync), profile ``forgery``, found by the generated
  run (``benchmarks/``, 666 sequences): ``start; append_request(120000);
  append_forged_request; append_request(120000); flip_byte(segment=0, record=1,
  where=kind); restart(clean, replay=all)`` -> "acknowledged requests never delivered:
  {a: [1], b: [1]}": the "settled" mark forged inside request 2 is read as a record
  once request 2's header is damaged, and request 1 is dropped.  Control: damage
  request 1 instead (only request 1 is lost, which is allowed and counted).
* defect 6 (the disk bound), profile ``disk_bound``, also found by the generated run
  (``benchmarks/``, 1065 sequences: 1242058 bytes on disk), written out shorter:
  ``start; append_request(120000) x9; judge(pick=0, attach=span, size=100000)`` -> "the
  log uses 1180382 bytes on disk; the bound is 1179648": requests are refused from
  1080261 bytes on, output records are not.  Control: a 100-byte result.
* found 1, not in the issue (delivery marks release an entry whose result is still to
  come), profile ``checkpoint``, found by the generated run (``benchmarks/``, 915
  sequences, as ``append_request x4; deliver(a, 0); append_request x3; deliver(b, 0);
  append_request; restart(clean, all) x2``), written out shorter: ``start;
  append_request(200); restart(clean, replay=all); deliver(a, pick=0);
  deliver(b, pick=0); restart(clean, replay=all); restart(clean, ...)`` -> "checkpoint
  4 passes entries still needed: [1]".  Pins are not logged: at the replay the two
  delivery marks release entry 1 before it is judged, the hold taken for its
  judgement finds nothing to pin, and the checkpoint passes it; a stop before the
  result is logged loses the evaluation for good.  Control: judged before delivery.
  Fixed: a replayed request is also held until the processor has forwarded it
  (``Storage.forwarded``), and the evaluator takes its hold before that.
* found 2, not in the issue (the settled-mark window), profile ``clean_restart``,
  found by the generated run (``benchmarks/``, 828 sequences, as ``append_request
  x13; judge x2; deliver(both, pick=1); restart(clean, all)``), written out shorter:
  ``start; append_request(200) x2; judge(pick=1, attach=span); deliver(a, pick=1);
  deliver(b, pick=1); restart(clean, replay=all)`` -> "exporter b is sent entry 2
  again after a clean restart".  The last exporter to settle an entry leaves no
  delivery mark, and a "settled" mark is written only when the older entry has held
  the checkpoint back for over a second.  Control: ``wait(1.5)`` before ``b``
  delivers.

Defect 2 (late results on a replayed trace that reached an exporter) is the pipeline's
and the evaluator's choice of carrier mode: out of this machine's reach (it does not
run the evaluator).  Defect 7 (small ones) is not a property of sequences.

The generated runs: the suite runs every profile on a fixed set of sequences
(``derandomize``, no example database; 30 sequences of up to 40 steps per profile, 20
for ``disk_bound``: 179 sequences and 4865 steps in all, 8-15 s on a loaded
2-core machine; Hypothesis's deadline is off).  When the model was written (before the
rework) a smaller budget found none of the failures above: each needs a particular
5-10 step pattern among about 8 rules, found in about 1 of 700-900 random sequences;
so the shortest sequences are pinned above.  The present budget finds found 1 on the
code without its fix (``checkpoint`` profile, within its first 25 sequences: ``checkpoint
2 passes entries still needed: [1]``).  ``benchmarks/storage_model.py`` runs fresh
random sequences for minutes (``--seconds``, ``--examples``) and prints the sequences,
steps, crashes and clean stops it checked: the long runs that were in the suite
(300 sequences per profile, 7 minutes in CI) live there.  In 9 minutes on the code
before the rework it found defect 5, defect 6, found 1 and found 2 on its own (figures
in the report of issue 27).  Defects 1, 3 and 4 were found by writing the sequence out
from the rules.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.storage.model import machine_for

Step = tuple[str, dict[str, Any]]

_BIG = {"size": 120_000}
_ALL = {"records": 1000, "judge_early": False}
_NINE_BIG: list[Step] = [("append_request", _BIG)] * 9
_SEQUENCES: dict[str, tuple[str, list[Step], list[Step]]] = {
    # name: (profile, the failing sequence, a control that differs in its key step)
    "defect1_checkpoint_passes_unsettled_after_replay_logs_a_carrier": (
        "checkpoint",
        [
            ("start", {}),
            ("append_request", {"size": 200}),
            ("append_request", {"size": 200}),
            ("restart", {"how": "clean", "replay": "stepwise"}),
            ("replay", {"records": 1, "judge_early": True}),
            ("replay", _ALL),
            ("deliver", {"exporter": "both", "pick": 1}),
            ("restart", {"how": "clean", "replay": "stepwise"}),
        ],
        [
            ("start", {}),
            ("append_request", {"size": 200}),
            ("append_request", {"size": 200}),
            ("restart", {"how": "clean", "replay": "stepwise"}),
            ("replay", {"records": 1, "judge_early": False}),
            ("replay", _ALL),
            ("deliver", {"exporter": "both", "pick": 1}),
            ("restart", {"how": "clean", "replay": "stepwise"}),
        ],
    ),
    "found1_marks_release_an_entry_still_awaiting_its_result": (
        "checkpoint",
        [
            ("start", {}),
            ("append_request", {"size": 200}),
            ("restart", {"how": "clean", "replay": "all"}),
            ("deliver", {"exporter": "a", "pick": 0}),
            ("deliver", {"exporter": "b", "pick": 0}),
            ("restart", {"how": "clean", "replay": "all"}),
            ("restart", {"how": "clean", "replay": "stepwise"}),
        ],
        [
            ("start", {}),
            ("append_request", {"size": 200}),
            ("restart", {"how": "clean", "replay": "all"}),
            ("judge", {"pick": 0, "attach": "span", "size": 100}),
            ("deliver", {"exporter": "a", "pick": 0}),
            ("deliver", {"exporter": "b", "pick": 0}),
            ("restart", {"how": "clean", "replay": "all"}),
            ("restart", {"how": "clean", "replay": "stepwise"}),
        ],
    ),
    "found2_settled_out_of_order_within_a_second_is_resent_after_a_clean_stop": (
        "clean_restart",
        [
            ("start", {}),
            ("append_request", {"size": 200}),
            ("append_request", {"size": 200}),
            ("judge", {"pick": 1, "attach": "span", "size": 100}),
            ("deliver", {"exporter": "a", "pick": 1}),
            ("deliver", {"exporter": "b", "pick": 1}),
            ("restart", {"how": "clean", "replay": "all"}),
        ],
        [
            ("start", {}),
            ("append_request", {"size": 200}),
            ("append_request", {"size": 200}),
            ("judge", {"pick": 1, "attach": "span", "size": 100}),
            ("deliver", {"exporter": "a", "pick": 1}),
            ("wait", {"seconds": 1.5}),
            ("deliver", {"exporter": "b", "pick": 1}),
            ("restart", {"how": "clean", "replay": "all"}),
        ],
    ),
    "defect3_marks_vanish_with_their_segment": (
        "clean_restart",
        [
            ("start", {}),
            ("append_request", _BIG),
            ("append_request", _BIG),
            ("deliver", {"exporter": "a", "pick": 0}),
            ("append_request", _BIG),
            ("deliver", {"exporter": "both", "pick": 0}),
            ("judge", {"pick": 1, "attach": "span", "size": 100}),
            ("restart", {"how": "clean", "replay": "all"}),
        ],
        [
            ("start", {}),
            ("append_request", _BIG),
            ("append_request", _BIG),
            ("deliver", {"exporter": "a", "pick": 0}),
            ("deliver", {"exporter": "both", "pick": 0}),
            ("judge", {"pick": 1, "attach": "span", "size": 100}),
            ("restart", {"how": "clean", "replay": "all"}),
        ],
    ),
    "defect4_a_hold_never_ends_after_a_timed_out_then_failed_output_write": (
        "holds",
        [
            ("start", {}),
            ("append_request", {"size": 200}),
            ("disk_stalls", {}),
            ("judge", {"pick": 0, "attach": "carrier", "size": 100}),
            ("wait", {"seconds": 11.0}),
            ("disk_resumes", {"fails": True}),
        ],
        [
            ("start", {}),
            ("append_request", {"size": 200}),
            ("disk_stalls", {}),
            ("judge", {"pick": 0, "attach": "carrier", "size": 100}),
            ("wait", {"seconds": 0.5}),
            ("disk_resumes", {"fails": True}),
        ],
    ),
    "defect5_a_forged_record_read_after_a_damaged_header": (
        "forgery",
        [
            ("start", {}),
            ("append_request", _BIG),
            ("append_forged_request", {}),
            ("append_request", _BIG),
            ("flip_byte", {"segment": 0, "record": 1, "where": "kind"}),
            ("restart", {"how": "clean", "replay": "all"}),
        ],
        [
            ("start", {}),
            ("append_request", _BIG),
            ("append_forged_request", {}),
            ("append_request", _BIG),
            ("flip_byte", {"segment": 0, "record": 0, "where": "kind"}),
            ("restart", {"how": "clean", "replay": "all"}),
        ],
    ),
    "defect6_outputs_written_past_the_disk_bound": (
        "disk_bound",
        [
            ("start", {}),
            *([("append_request", _BIG)] * 9),
            ("judge", {"pick": 0, "attach": "span", "size": 100000}),
        ],
        [
            ("start", {}),
            *([("append_request", _BIG)] * 9),
            ("judge", {"pick": 0, "attach": "span", "size": 100}),
        ],
    ),
}


def _play(profile: str, steps: list[Step]) -> None:
    """Run ``steps`` on a fresh machine, the invariants after each, then the final
    replay (teardown), as Hypothesis would."""
    machine = machine_for(profile)()
    try:
        for name, arguments in steps:
            getattr(machine, name)(**arguments)
            machine.check_all_invariants()
    except BaseException:
        machine.failed = True
        machine.teardown()
        raise
    machine.teardown()


@pytest.mark.parametrize("name", sorted(_SEQUENCES))
def test_the_shortest_sequence_found_for_each_defect(name: str) -> None:
    profile, steps, _control = _SEQUENCES[name]
    _play(profile, steps)


@pytest.mark.parametrize("name", sorted(_SEQUENCES))
def test_the_same_sequence_without_its_key_step_holds(name: str) -> None:
    """The controls: each sequence above, with its key step changed, passes (on the
    code before the rework too: the failures were the defects, not the machine)."""
    profile, _steps, control = _SEQUENCES[name]
    _play(profile, control)


def _settings(examples: int, steps: int) -> settings:
    return settings(
        deadline=None,
        max_examples=examples,
        stateful_step_count=steps,
        derandomize=True,  # the same sequences on every run
        database=None,
        suppress_health_check=list(HealthCheck),
    )


def _run(profile: str, examples: int, steps: int) -> None:
    machine = machine_for(profile)
    machine.TestCase.settings = _settings(examples, steps)
    machine.TestCase().runTest()


#: profile -> (sequences in the suite, steps per sequence at most).
_GENERATED: dict[str, tuple[int, int]] = {
    "checkpoint": (30, 40),
    "clean_restart": (30, 40),
    "holds": (30, 40),
    "forgery": (30, 40),
    "disk_bound": (20, 40),
    "everything": (30, 40),
}


@pytest.mark.parametrize("profile", sorted(_GENERATED))
def test_generated_sequences(profile: str) -> None:
    """A fixed set of generated sequences per profile: any violation fails, with the
    shortest sequence Hypothesis finds."""
    examples, steps = _GENERATED[profile]
    _run(profile, examples, steps)
