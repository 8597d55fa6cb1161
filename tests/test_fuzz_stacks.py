"""Property: whatever a stack file says, `gpu-k8s plan` answers with a plan (exit 0) or with problems that
each name a key and a fix (exit 2) - never a traceback, never a hang.

Each case mutates one of the example stacks the way the fuzzer of the input-edge issue did: keys deleted,
values replaced by odd ones (wrong types, huge numbers, control characters, Unicode digits, empty
containers), or a line of the file repeated (duplicate keys, broken indentation). Budget: FUZZ_EXAMPLES
cases (default 40, about 15 s on a 2-core machine), each one plan of about a second and at most 15 s
(room for a loaded CI machine). Under CI the cases are derived from the test's name, so a red run
repeats; locally every run draws new ones (FUZZ_EXAMPLES=1000 for a long session)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_k8s.tools.plan import main
from tests.paths import FIXTURE_STACKS

STACKS = sorted(FIXTURE_STACKS.glob("Pulumi.*.yaml"))
ODD_VALUES = [
    None,
    "",
    " ",
    "x\n",
    "1e9",
    "null",
    "yes",
    -1,
    0,
    2**31,
    2**63,
    1.5,
    True,
    [],
    {},
    "é",
    "\u0661\u0662",
    "5m\n",
    "0.0.0.0/0",
    "a" * 300,
    [1],
    {"a": 1},
]
values = st.one_of(
    st.sampled_from(ODD_VALUES),
    st.text(max_size=12),
    st.integers(),
    st.floats(),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
PROBLEM_LINE = re.compile(r"  - \S.*?: .+\. Fix: .+")


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        found += _paths(child, (*prefix, key))
    return found


@st.composite
def mutated_stack_text(draw: st.DrawFn) -> str:
    document = yaml.safe_load(draw(st.sampled_from(STACKS)).read_text())
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(document)
        if not paths:
            break
        *parents, last = draw(st.sampled_from(paths))
        parent = document
        for part in parents:
            parent = parent[part]
        if draw(st.booleans()):
            del parent[last]
        else:
            parent[last] = draw(values)
    text = yaml.safe_dump(document, allow_unicode=True)
    if draw(st.integers(min_value=0, max_value=4)) == 0:
        lines = text.splitlines(keepends=True)
        index = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        text = "".join(lines[: index + 1] + lines[index:])
    return text


@pytest.fixture(scope="module", autouse=True)
def warm_imports():
    """The first plan imports the cloud SDKs (seconds); the deadline is for what a case itself costs."""
    for stack in STACKS:
        with contextlib.redirect_stdout(io.StringIO()):
            assert main([str(stack), "--json"]) == 0


@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "40")),
    deadline=15000,
    derandomize=os.environ.get("CI") == "true",
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(mutated_stack_text())
def test_every_stack_file_gets_a_plan_or_named_problems(text):
    with tempfile.TemporaryDirectory() as directory:
        stack = Path(directory) / "Pulumi.fuzz.yaml"
        stack.write_text(text)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(stack), "--json"])
    if code == 0:
        assert out.getvalue().startswith("{") and '"resources"' in out.getvalue()
        return
    assert code == 2
    assert out.getvalue() == ""
    header, *problems = err.getvalue().splitlines()
    assert header.endswith("problem(s)):"), err.getvalue()
    assert problems and all(PROBLEM_LINE.fullmatch(line) for line in problems), err.getvalue()
