"""Every choice a suite makes says what it was made on, and never names the split
the suite scores: the suites' ``CHOSEN_ON`` and the ``chosen_on`` of the
committed reports' JSON."""

import json
import pathlib

import pytest

from benchmarks.report import chosen_on_section
from benchmarks.runner import load_suite, SUITES

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "results"
#: What a choice may be made on: train sentences the fits do not see, other
#: tasks than the scored ones (development programs), or a rule fixed in
#: advance (never the scored split).
ALLOWED = {"train", "development", "rule"}
#: The suites that do not declare their choices yet: this set only shrinks (it
#: is empty), and a new suite declares its own.
PENDING = set()


def _problems(chosen_on, scored_split):
    problems = []
    for choice, entry in chosen_on.items():
        on = entry.get("on") if isinstance(entry, dict) else None
        if on not in ALLOWED or on == scored_split:
            problems.append(f"{choice}: chosen on {on!r}")
        if not (isinstance(entry, dict) and entry.get("why")):
            problems.append(f"{choice}: no why")
    return problems


@pytest.mark.parametrize("name", sorted(SUITES))
def test_a_suites_choices_are_made_on_train_sentences_or_by_a_rule(name):
    suite = load_suite(name)
    chosen_on = getattr(suite, "CHOSEN_ON", None)
    if name in PENDING:
        assert chosen_on is None, f"{name} declares CHOSEN_ON: take it off PENDING"
        pytest.skip(f"{name}: its choices are not declared yet (issue 63, item 1)")
    assert chosen_on, f"{name} declares no CHOSEN_ON"
    scored = suite.DEFAULTS.get("split", "dev")
    assert _problems(chosen_on, scored) == []


def test_the_committed_reports_choices_do_not_name_their_scored_split():
    reports = [path for path in sorted(RESULTS.glob("*.json"))]
    assert reports
    for path in reports:
        data = json.loads(path.read_text())
        if "chosen_on" in data:
            assert _problems(data["chosen_on"], data.get("split", "dev")) == [], path.name


#: Committed suite reports from runs before their suite declared its choices;
#: each leaves this set when its suite is rerun (this set only shrinks).
REPORTS_BEFORE_CHOSEN_ON = {"squad.json"}


def test_every_committed_suite_report_carries_its_choices():
    missing = set()
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("suite") in SUITES and "chosen_on" not in data:
            missing.add(path.name)
    assert missing <= REPORTS_BEFORE_CHOSEN_ON, f"suite reports without chosen_on: {sorted(missing - REPORTS_BEFORE_CHOSEN_ON)}"
    rerun = REPORTS_BEFORE_CHOSEN_ON - missing
    assert not rerun, f"{sorted(rerun)} no longer lack chosen_on: take them off REPORTS_BEFORE_CHOSEN_ON"


def test_the_report_states_each_choice():
    results = {"chosen_on": {"eps": {"on": "train", "why": "1000 held-out train sentences"}}}
    text = "\n".join(chosen_on_section(results))
    assert "## What each choice was made on" in text
    assert "| eps | `train` | 1000 held-out train sentences |" in text
    assert chosen_on_section({}) == []


def test_the_check_catches_a_choice_on_the_scored_split():
    assert _problems({"eps": {"on": "dev", "why": "scored on all of dev"}}, "dev") == ["eps: chosen on 'dev'"]
    assert _problems({"eps": {"on": "train"}}, "dev") == ["eps: no why"]
