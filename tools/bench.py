"""Benchmark of the offline plan (not a timed test; numbers go into notes and pull requests).

    gpu-k8s bench [--runs 5] [--stack aws-eks]

Reports, on this machine, for one stack, each figure the median of --runs, the runs of the programs being
compared interleaved (plan, replay, floor, plan, replay, floor, ...) so a slower minute hits all of them:
- whole process: `gpu-k8s plan <stack>`; a flat replay of the same plan (a process that imports the SDK
  modules the plan loads and registers the recorded resources, with their types, names, inputs, parents,
  providers, dependencies and options, through the SDK's typed classes, under the same mock engine);
  and the import floor (only those imports);
- in process, with 1 and 50 copies of the stack's first GPU pool: the plan and the replay of each, and
  what each extra pool costs in both. The replay's share is what the SDK and the engine spend on the
  pool's resources themselves (26 on aws-eks with `batch`: a node group and six scale-from-zero tags per
  zone, a launch template, and the pool's three Kueue objects);
  the difference is the toolkit's own work per pool (validation, rendering, the outputs it combines);
- peak RSS of the processes (the plan's is the largest).
Budget (2-core machine): plan <= 2x the import floor; the toolkit's own work <= 20 ms per extra pool;
peak RSS < 400 MB.
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import inspect
import json
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pulumi

from gpu_k8s.tools.engine import (
    Project,
    Recording,
    Registration,
    Secret,
    find_project,
    run_program,
    stack_config,
)

# Prints the Pulumi SDK modules a plan really executed (the SDKs load submodules lazily, so a module
# object in sys.modules may be a stub that was never run).
LOADED_SDK_MODULES = """
import contextlib, importlib.util, io, sys
import gpu_k8s.tools.plan
SDKS = {"pulumi", "pulumi_aws", "pulumi_gcp", "pulumi_kubernetes", "pulumi_random", "pulumi_tls"}
with contextlib.redirect_stdout(io.StringIO()):
    gpu_k8s.tools.plan.main([sys.argv[1]])
print(" ".join(sorted(name for name, module in list(sys.modules.items())
                      if name.split(".")[0] in SDKS
                      and type(module).__name__ != "_LazyModule")))
"""
# Imports (and, for lazy stubs, runs) exactly those modules: the floor no plan can beat.
IMPORT_FLOOR = """
import importlib, pathlib, sys
for name in pathlib.Path(sys.argv[1]).read_text().split():
    getattr(importlib.import_module(name), "__file__", None)
"""
# The flat replay as a process: the floor's imports, then the recorded resources under the mock engine.
REPLAY = (
    IMPORT_FLOOR
    + """
from gpu_k8s.tools.bench import replay_file
replay_file(sys.argv[2])
"""
)


def flat_program(recording: Recording) -> Callable[[], None]:
    """A program that registers exactly the recorded resources, with none of the toolkit's logic."""

    def program() -> None:
        made: dict[str, pulumi.Resource] = {}
        for registration in recording.registrations:
            made[registration.urn] = _register(registration, made)

    return program


def _register(registration: Registration, made: dict[str, pulumi.Resource]) -> pulumi.Resource:
    # A provider reference is "<urn>::<id>".
    provider = made.get(registration.provider.rsplit("::", 1)[0]) if registration.provider else None
    opts = pulumi.ResourceOptions(
        parent=made.get(registration.parent),
        provider=provider if isinstance(provider, pulumi.ProviderResource) else None,
        depends_on=[made[urn] for urn in registration.dependencies if urn in made],
        additional_secret_outputs=registration.options.get("additionalSecretOutputs"),
        ignore_changes=registration.options.get("ignoreChanges"),
        retain_on_delete=registration.options.get("retainOnDelete"),
        replace_on_changes=registration.options.get("replaceOnChanges"),
        delete_before_replace=registration.options.get("deleteBeforeReplace"),
    )
    inputs = _as_inputs(registration.inputs)
    if registration.type.startswith("pulumi:providers:"):
        package = registration.type.split(":")[2]
        return pulumi.ProviderResource(package, registration.name, inputs, opts)
    if not registration.custom:
        return pulumi.ComponentResource(registration.type, registration.name, None, opts)
    typed = typed_class(registration.type)
    arguments = _keyword_arguments(typed, inputs) if typed is not None else None
    if typed is None or arguments is None:
        return pulumi.CustomResource(registration.type, registration.name, inputs, opts)
    return typed(registration.name, opts=opts, **arguments)


# Python package of each provider the plans use.
SDK_PACKAGES = {
    "aws": "pulumi_aws",
    "gcp": "pulumi_gcp",
    "kubernetes": "pulumi_kubernetes",
    "tls": "pulumi_tls",
    "random": "pulumi_random",
}
# Kubernetes API groups with typed classes in pulumi_kubernetes (other groups: custom resources).
KUBERNETES_GROUPS = ("core", "apps", "rbac", "storage", "scheduling", "apiextensions", "helm", "batch")


def typed_class(token: str) -> type[pulumi.CustomResource] | None:
    """The SDK class of a resource type token ("aws:ec2/launchTemplate:LaunchTemplate" ->
    pulumi_aws.ec2.LaunchTemplate), or None for a type the plans do not use."""
    package, module, name = token.split(":")
    root = SDK_PACKAGES.get(package)
    if root is None:
        return None
    if package == "kubernetes":
        group, _, version = module.rpartition("/")
        if group.split(".")[0] not in KUBERNETES_GROUPS:
            custom: type[pulumi.CustomResource] = importlib.import_module(
                f"{root}.apiextensions"
            ).CustomResource
            return custom
        path = f"{root}.{group.split('.')[0]}.{version}"
    else:
        first = module.split("/")[0]
        path = root if first == "index" else f"{root}.{first}"
    found = getattr(importlib.import_module(path), name, None)
    return found if isinstance(found, type) and issubclass(found, pulumi.CustomResource) else None


def _keyword_arguments(typed: type[pulumi.CustomResource], inputs: dict[str, Any]) -> dict[str, Any] | None:
    """The recorded top-level inputs as the class's keyword arguments (nested values stay as recorded: the
    SDK passes mapping keys it does not know through), or None when one has no argument."""
    parameters = set(inspect.signature(getattr(typed, "_internal_init", typed.__init__)).parameters)
    arguments = {}
    for key, value in inputs.items():
        argument = re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()
        if argument not in parameters:
            return None
        arguments[argument] = value
    return arguments


def _as_inputs(value: Any) -> Any:
    if isinstance(value, Secret):
        return pulumi.Output.secret(_as_inputs(value.value))
    if isinstance(value, dict):
        return {key: _as_inputs(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_inputs(item) for item in value]
    return value


# How a recorded secret is written to and read from the saved recording.
SECRET_MARK = "<secret>"


def _to_json(value: Any) -> Any:
    if isinstance(value, Secret):
        return {SECRET_MARK: value.value}
    raise TypeError(f"cannot save {type(value).__name__}")


def _from_json(mapping: dict[str, Any]) -> Any:
    return Secret(mapping[SECRET_MARK]) if set(mapping) == {SECRET_MARK} else mapping


def replay_file(path: str) -> None:
    """Replay a recording saved by `_save` (the whole-process replay)."""
    saved = json.loads(Path(path).read_text(), object_hook=_from_json)
    recording = Recording(
        stack=saved["stack"], registrations=[Registration(**r) for r in saved["registrations"]]
    )
    run_program(saved["stack"], saved["config"], program=flat_program(recording))


def _save(recording: Recording, config: dict[str, Any], path: Path) -> None:
    # Field by field: dataclasses.asdict would turn the Secret markers into plain mappings.
    registrations = [{f.name: getattr(r, f.name) for f in fields(r)} for r in recording.registrations]
    saved = {"stack": recording.stack, "config": config, "registrations": registrations}
    path.write_text(json.dumps(saved, default=_to_json))


def _config_with_pools(project: Project, stack: str, count: int) -> dict[str, Any]:
    config = copy.deepcopy(stack_config(project.stack_dir / f"Pulumi.{stack}.yaml", project))
    template = config["gpu-k8s:cluster"]["gpuPools"][0]
    config["gpu-k8s:cluster"]["gpuPools"] = [{**template, "name": f"pool{i}"} for i in range(count)]
    return config


def _interleaved(named: dict[str, Callable[[], object]], runs: int) -> dict[str, float]:
    """Median seconds of each callable, run in turns."""
    samples: dict[str, list[float]] = {name: [] for name in named}
    for _ in range(runs):
        for name, run in named.items():
            start = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def _process(command: list[str], cwd: Path) -> Callable[[], object]:
    def run() -> None:
        finished = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
        if finished.returncode != 0:
            raise SystemExit(f"{command[1:3]} failed:\n{finished.stderr[-2000:]}")

    return run


def _lines(
    stack: str, runs: int, whole: dict[str, float], inside: dict[str, float], peak_mib: float
) -> Iterator[str]:
    plan, replay, floor = whole["plan"], whole["replay"], whole["floor"]
    yield f"whole process, median of {runs} interleaved runs of each:"
    ratios = f"{plan / replay:.2f}x the flat replay, {plan / floor:.2f}x the floor; budget 2x the floor"
    yield f"  plan {stack:29s}{plan:6.2f} s  ({ratios})"
    yield f"  flat replay of the same resources  {replay:6.2f} s"
    yield f"  import floor                       {floor:6.2f} s"
    yield "in process:"
    for pools in (1, 50):
        plan_s, replay_s = inside[f"plan{pools}"], inside[f"replay{pools}"]
        yield f"  {pools:2d} GPU pool(s): plan {plan_s:6.3f} s, replay {replay_s:6.3f} s"
    plan_ms = (inside["plan50"] - inside["plan1"]) / 49 * 1000
    replay_ms = (inside["replay50"] - inside["replay1"]) / 49 * 1000
    yield f"  each extra GPU pool: plan {plan_ms:5.1f} ms, replay {replay_ms:5.1f} ms"
    yield f"    the toolkit's own work:          {plan_ms - replay_ms:5.1f} ms (budget 20 ms)"
    yield f"peak RSS of a child process:         {peak_mib:6.0f} MiB (budget 400 MiB)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-k8s bench", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--stack", default="aws-eks")
    args = parser.parse_args(argv)
    project = find_project()
    python = sys.executable

    loaded = subprocess.run(
        [python, "-c", LOADED_SDK_MODULES, args.stack],
        check=True,
        capture_output=True,
        text=True,
        cwd=project.root,
    ).stdout
    configs = {pools: _config_with_pools(project, args.stack, pools) for pools in (1, 50)}
    recordings = {pools: run_program("bench", config, project=project) for pools, config in configs.items()}
    with tempfile.TemporaryDirectory() as scratch:
        modules, saved = Path(scratch) / "modules.txt", Path(scratch) / "recording.json"
        modules.write_text(loaded)
        stack_file_config = stack_config(project.stack_dir / f"Pulumi.{args.stack}.yaml", project)
        _save(run_program(args.stack, stack_file_config, project=project), stack_file_config, saved)
        whole = _interleaved(
            {
                "plan": _process([python, "-m", "gpu_k8s.tools.plan", args.stack], project.root),
                "replay": _process([python, "-c", REPLAY, str(modules), str(saved)], project.root),
                "floor": _process([python, "-c", IMPORT_FLOOR, str(modules)], project.root),
            },
            args.runs,
        )
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    inside: dict[str, Callable[[], object]] = {}
    for pools in (1, 50):
        inside[f"plan{pools}"] = functools.partial(run_program, "bench", configs[pools], project=project)
        inside[f"replay{pools}"] = functools.partial(
            run_program, "bench", configs[pools], program=flat_program(recordings[pools])
        )
    in_process = _interleaved(inside, args.runs)
    for line in _lines(args.stack, args.runs, whole, in_process, peak_mib):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
