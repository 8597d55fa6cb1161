"""The bench's flat replay registers exactly what the plan registers, so the ratio it reports compares the
toolkit with the cost of its resources alone."""

from __future__ import annotations

import json

import pytest

from gpu_k8s.tools.bench import _keyword_arguments, _save, flat_program, replay_file, typed_class
from gpu_k8s.tools.engine import Recording, find_project, run_program, stack_config
from tests.conftest import some
from tests.paths import FIXTURE_STACKS

STACKS = ("aws-eks", "aws-k3s", "gcp-gke", "gcp-k3s")


def _resources(recording: Recording) -> list[str]:
    return sorted(
        json.dumps(
            [r.urn, r.custom, r.inputs, r.parent, r.provider, sorted(r.dependencies), _options(r.options)],
            sort_keys=True,
            default=repr,
        )
        for r in some(recording.registrations, at_least=20)
    )


def _options(options: dict) -> dict:
    """Resource options, with the secret outputs as the set the engine treats them as (a typed class adds
    its own to those the program names, so a name may come twice)."""
    secret = options.get("additionalSecretOutputs")
    return {**options, "additionalSecretOutputs": sorted(set(secret))} if secret else options


@pytest.mark.parametrize("stack", STACKS)
def test_the_flat_replay_registers_what_the_plan_registers(stack):
    project = find_project()
    config = stack_config(FIXTURE_STACKS / f"Pulumi.{stack}.yaml", project)
    plan = run_program(stack, config, project=project)
    replay = run_program(stack, config, program=flat_program(plan))
    assert _resources(replay) == _resources(plan)


def test_a_saved_recording_replays_with_its_secrets(tmp_path, monkeypatch):
    project = find_project()
    config = stack_config(FIXTURE_STACKS / "Pulumi.aws-k3s.yaml", project)
    plan = run_program("aws-k3s", config, project=project)
    _save(plan, config, tmp_path / "recording.json")
    replays: list[Recording] = []
    monkeypatch.setattr(
        "gpu_k8s.tools.bench.run_program", lambda *a, **k: replays.append(run_program(*a, **k))
    )
    replay_file(str(tmp_path / "recording.json"))
    (replay,) = replays
    assert _resources(replay) == _resources(plan)
    assert '"<secret>"' not in json.dumps(_resources(replay))


@pytest.mark.parametrize("stack", STACKS)
def test_the_replay_registers_every_resource_through_its_typed_sdk_class(stack):
    project = find_project()
    config = stack_config(FIXTURE_STACKS / f"Pulumi.{stack}.yaml", project)
    untyped = []
    for r in some(run_program(stack, config, project=project).registrations, at_least=20):
        # Providers and dynamic resources (the k3s API readiness gate and server count) have no SDK class to
        # replay through.
        if r.custom and not r.type.startswith(("pulumi:providers:", "pulumi-python:dynamic:")):
            typed = typed_class(r.type)
            if typed is None or _keyword_arguments(typed, r.inputs) is None:
                untyped.append(r.type)
    assert untyped == []
