"""Benchmark of the offline plan (not a timed test; numbers go into notes and pull requests).

    gpu-k8s bench [--runs 5] [--stack aws-eks]

Reports, on this machine, for one stack:
- whole-process `gpu-k8s plan <stack>` vs a process that only imports the Pulumi modules the
  plan uses (the floor no plan can beat), median of --runs each;
- the in-process plan time with 1, 10 and 50 copies of the stack's first GPU pool and the cost of each
  extra pool;
- peak RSS of the whole-process plan.
Budget (2-core machine): plan <= 2x the import floor; < 30 ms per extra pool; peak RSS < 400 MB.
"""

from __future__ import annotations

import argparse
import copy
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gpu_k8s.tools.engine import Project, find_project, run_program, stack_config

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
import importlib, sys
for name in sys.argv[1].split():
    getattr(importlib.import_module(name), "__file__", None)
"""


def _median_seconds(command: list[str], runs: int, cwd: Path) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, cwd=cwd)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _config_with_pools(project: Project, stack: str, count: int) -> dict:
    config = copy.deepcopy(stack_config(project.stack_dir / f"Pulumi.{stack}.yaml", project))
    template = config["gpu-k8s:cluster"]["gpuPools"][0]
    config["gpu-k8s:cluster"]["gpuPools"] = [{**template, "name": f"pool{i}"} for i in range(count)]
    return config


def _in_process_seconds(project: Project, stack: str, pools: int, runs: int) -> float:
    config = _config_with_pools(project, stack, pools)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        run_program("bench", config, project=project)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-k8s bench", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--stack", default="aws-eks")
    args = parser.parse_args(argv)
    project = find_project()

    modules = subprocess.run(
        [sys.executable, "-c", LOADED_SDK_MODULES, args.stack],
        check=True,
        capture_output=True,
        text=True,
        cwd=project.root,
    ).stdout.strip()
    floor = _median_seconds([sys.executable, "-c", IMPORT_FLOOR, modules], args.runs, project.root)
    whole = _median_seconds([sys.executable, "-m", "gpu_k8s.tools.plan", args.stack], args.runs, project.root)
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    run_program("warm-up", _config_with_pools(project, args.stack, 1), project=project)
    per_pools = {n: _in_process_seconds(project, args.stack, n, args.runs) for n in (1, 10, 50)}
    per_extra_pool_ms = (per_pools[50] - per_pools[1]) / 49 * 1000

    print(f"import floor, {len(modules.split())} SDK modules (median of {args.runs}): {floor:6.2f} s")
    label = f"whole-process plan {args.stack}:"
    print(f"{label:37s}{whole:6.2f} s  ({whole / floor:.2f}x the floor; budget 2x)")
    for pools, seconds in per_pools.items():
        print(f"in-process plan, {pools:2d} GPU pool(s):     {seconds:6.2f} s")
    print(f"each extra GPU pool:                 {per_extra_pool_ms:6.1f} ms (budget 30 ms)")
    print(f"peak RSS of a plan process:          {peak_mib:6.0f} MiB (budget 400 MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
