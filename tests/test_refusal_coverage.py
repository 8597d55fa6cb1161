"""Every rule that refuses a stack config is reached by at least one bad-input case of the suite.

The suite records where each ConfigIssue is made (tests/conftest.py); this test runs last and compares that
with every `ConfigIssue(...)` in components/ and providers/. It judges only a run of the whole suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FULL_RUN, REFUSAL_SITES_REACHED, refusal_rules, unreached_refusal_rules
from tests.paths import REPO_ROOT


def test_every_refusal_rule_is_reached_by_a_bad_input_case(request):
    if not request.config.stash.get(FULL_RUN, False):
        pytest.skip("judges only a run of the whole suite (no -k, -m or deselection)")
    assert len(refusal_rules()) > 80
    assert unreached_refusal_rules(REFUSAL_SITES_REACHED) == []


def test_the_coverage_check_sees_an_unreached_rule():
    rules = refusal_rules()
    (path, first, _), text = next(iter(rules.items()))
    reached_all_but_one = {(p, f) for (p, f, _) in rules if (p, f) != (path, first)}
    assert unreached_refusal_rules(reached_all_but_one) == [
        f"{Path(path).relative_to(REPO_ROOT)}:{first}: {text}"
    ]
    assert unreached_refusal_rules({(p, f) for (p, f, _) in rules}) == []
