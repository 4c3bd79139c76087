"""release_tests.report: what was found after a section's run is said under it, and only
while that run is the one shown (pure)."""

from __future__ import annotations

from pathlib import Path

from release_tests.report import FOUND_SINCE, section
from release_tests.report_tables import Where


def rendered(name: str, commit: str) -> str:
    result = {"command": f"python -m release_tests.{name}", "commit": commit,
              "summary": {}}
    return section(name, "a title", "", result, Where(Path("plots"), Path(".")))


def test_a_finding_is_shown_under_the_run_it_concerns_and_gone_after_a_rerun():
    (name, commit), found = next(iter(FOUND_SINCE.items()))
    assert found in rendered(name, commit)
    assert found not in rendered(name, "0000000")
