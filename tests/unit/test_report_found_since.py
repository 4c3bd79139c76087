"""release_tests.report: what was found after a section's run is said under it, and only
while that run is the one shown (pure)."""

from __future__ import annotations

from pathlib import Path

from release_tests import report
from release_tests.report import section
from release_tests.report_tables import Where


def rendered(name: str, commit: str) -> str:
    result = {"command": f"python -m release_tests.{name}", "commit": commit,
              "summary": {}}
    return section(name, "a title", "", result, Where(Path("plots"), Path(".")))


def test_a_finding_is_shown_under_the_run_it_concerns_and_gone_after_a_rerun(monkeypatch):
    name, commit, found = "llm_routing", "abc1234", "Read with the random bar: a finding."
    monkeypatch.setitem(report.FOUND_SINCE, (name, commit), found)
    assert found in rendered(name, commit)
    assert found not in rendered(name, "0000000")
