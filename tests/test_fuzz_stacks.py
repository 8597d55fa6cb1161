"""Property: whatever a stack file says, `gpu-k8s plan` answers with a plan (exit 0) or with problems that
each name a key and a fix (exit 2) - never a traceback, never a hang.

Each case mutates a seed, one of the fixture stacks with every top-level key of its platform filled in or
the GPU layer example's stack (every config root and section), the way the fuzzer of the input-edge issue
did: keys deleted,
values replaced by odd ones (wrong types, huge numbers, control characters, Unicode digits, empty
containers), or a line of the file repeated (duplicate keys, broken indentation). Budget: FUZZ_EXAMPLES
cases (default 40, about 15 s on a 2-core machine), each one plan of about a second and at most 15 s
(room for a loaded CI machine). Under CI the cases are derived from the test's name, so a red run
repeats; locally every run draws new ones (FUZZ_EXAMPLES=1000 for a long session)."""

from __future__ import annotations

import contextlib
import copy
import io
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpu_k8s  # noqa: F401  (registers the platforms the seeds read)
from gpu_k8s.components.spec import PLATFORMS
from gpu_k8s.tools.plan import main
from tests.paths import FIXTURE_STACKS, REPO_ROOT

STACKS = sorted(FIXTURE_STACKS.glob("Pulumi.*.yaml"))
# Valid values for every top-level key a fixture stack leaves out, so each case can reach every section of
# its platform (a key added to a platform without a seed here fails test_the_seeds_reach_every_section).
SEED_KEYS: dict[str, Any] = {
    "addonVersions": {"gpuOperator": "v26.7.0"},
    "allowPublicApiFromAnywhere": False,
    "batch": {"namespaces": ["research"], "podsReadyTimeout": "45m"},
    "eks": {"admins": ["arn:aws:iam::123456789012:role/ops"]},
    "monitoring": {"retention": "7d", "alerts": {"gpuIdleFor": "2h"}},
    "inference": {},
}
LAYER_EXAMPLE = REPO_ROOT / "examples" / "existing-eks"
LAYER_SEED_KEYS: dict[str, Any] = {
    "subnetIds": ["subnet-0a1b2c3d4e5f60718", "subnet-0b2c3d4e5f6071829"],
    "cuda": "12.8",
    "addonVersions": {"gpuOperator": "v26.7.0"},
}


def seeded(stack: Path) -> dict[str, Any]:
    """A fixture stack with every section its platform has (the cluster's, or the GPU layer's)."""
    document = yaml.safe_load(stack.read_text())
    config = document["config"]
    if "gpu-k8s:gpuLayer" in config:
        config["gpu-k8s:gpuLayer"] = {**copy.deepcopy(LAYER_SEED_KEYS), **config["gpu-k8s:gpuLayer"]}
        return document
    cluster = config["gpu-k8s:cluster"]
    allowed = set(_platform_keys(cluster["cloud"], cluster["kind"]))
    config["gpu-k8s:cluster"] = {
        **{key: copy.deepcopy(value) for key, value in SEED_KEYS.items() if key in allowed},
        **cluster,
    }
    return document


def _platform_keys(cloud: str, kind: str) -> list[str]:
    spec = PLATFORMS[(cloud, kind)].spec
    return [field.alias for field in spec.model_fields.values() if field.alias]


SEEDS = [*STACKS, LAYER_EXAMPLE / "stacks" / "Pulumi.dev.yaml"]
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
MORE_LINE = re.compile(r"  \.\.\. and \d+ more of the same kind or others")


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        found += _paths(child, (*prefix, key))
    return found


@st.composite
def mutated_stack_text(draw: st.DrawFn) -> tuple[Path, str]:
    seed = draw(st.sampled_from(SEEDS))
    document = seeded(seed)
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
    return seed, text


@pytest.fixture(scope="module", autouse=True)
def warm_imports():
    """The first plan imports the cloud SDKs (seconds); the deadline is for what a case itself costs."""
    for stack in STACKS:
        with contextlib.redirect_stdout(io.StringIO()):
            assert main([str(stack), "--json"]) == 0


def test_the_seeds_reach_every_section():
    """Every top-level key of every platform (and of the GPU layer) is in some seed the cases mutate, so a
    key added later is fuzzed without anyone remembering to."""
    from gpu_k8s.providers.aws.existing import ExistingEksSpec

    for cloud, kind in PLATFORMS:
        seeds = [seeded(stack)["config"]["gpu-k8s:cluster"] for stack in STACKS]
        keys = {key for seed in seeds if (seed["cloud"], seed["kind"]) == (cloud, kind) for key in seed}
        assert set(_platform_keys(cloud, kind)) <= keys, (cloud, kind)
    layer = seeded(SEEDS[-1])["config"]["gpu-k8s:gpuLayer"]
    assert {f.alias for f in ExistingEksSpec.model_fields.values() if f.alias} <= set(layer)
    for stack in SEEDS:
        with tempfile.TemporaryDirectory() as directory:
            written = _write_case(Path(directory), stack, yaml.safe_dump(seeded(stack)))
            with contextlib.redirect_stdout(io.StringIO()):
                assert main([str(written), "--json"]) == 0, stack


def _write_case(directory: Path, seed: Path, text: str) -> Path:
    """The case's stack file where its program is: the GPU layer's in a copy of its example project, the
    cluster's beside this repository's Pulumi.yaml (the project of a stack file outside any project is the
    working directory's, which the tests run in)."""
    if seed.is_relative_to(LAYER_EXAMPLE):
        project = directory / "existing-eks"
        shutil.copytree(LAYER_EXAMPLE, project)
        stack = project / "stacks" / "Pulumi.fuzz.yaml"
    else:
        stack = directory / "Pulumi.fuzz.yaml"
    stack.write_text(text)
    return stack


@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "40")),
    deadline=15000,
    derandomize=os.environ.get("CI") == "true",
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(mutated_stack_text())
def test_every_stack_file_gets_a_plan_or_named_problems(case):
    seed, text = case
    with tempfile.TemporaryDirectory() as directory:
        stack = _write_case(Path(directory), seed, text)
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
    if problems and MORE_LINE.fullmatch(problems[-1]):
        problems = problems[:-1]
    assert problems and all(PROBLEM_LINE.fullmatch(line) for line in problems), err.getvalue()
