"""Render a plan's Helm releases with real Helm 3 and the pinned upstream charts.

A `kubernetes:helm.sh/v3:Release` in a plan names a chart, a version, a repository (or an `oci://` chart
reference), a namespace and values. `release_ref` reads those inputs; `ChartRenderer.render` packages the
pinned chart directory under `upstream/charts/` exactly as its release workflow does (gpu-operator's git
Chart.yaml says v1.0.0-devel; its release runs `helm package --version TAG --app-version TAG`) and runs
`helm template` with the release's name, namespace, values and the stack's Kubernetes version, CRDs
included. `source_problem` says whether the repository the plan names serves that chart version, from the
record in `upstream/charts/sources.json`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from gpu_k8s.components.helm import OCI_SCHEME
from gpu_k8s.tools.helm import helm_binary
from gpu_k8s.tools.upstream import UPSTREAM_ROOT

CHARTS_ROOT = UPSTREAM_ROOT / "charts"
SOURCES = CHARTS_ROOT / "sources.json"
# A repository serves the version when its index lists it, or the chart's own docs name the repository and
# its index could not be read from here ("unverified", evidence recorded); never when its index lacks it.
SERVING_STATUSES = ("listed", "unverified")


class ManifestLoader(yaml.SafeLoader):
    """YAML as the API server reads it (YAML 1.2 through sigs.k8s.io/yaml): a plain `=` is the string "="
    (PyYAML, a YAML 1.1 loader, resolves it to the 1.1 `value` tag and has no constructor for it; the
    Prometheus Operator's CRDs list it among the label-matcher operators)."""


ManifestLoader.add_constructor("tag:yaml.org,2002:value", yaml.SafeLoader.construct_yaml_str)


@dataclass(frozen=True)
class ChartSource:
    chart: str
    version: str
    dir: str
    repositories: dict[str, dict[str, str]]
    package: dict[str, str] = field(default_factory=dict)
    # Values a release script writes into values.yaml just before packaging (not in git).
    release_values: dict[str, Any] = field(default_factory=dict)


@cache
def chart_sources() -> dict[tuple[str, str], ChartSource]:
    entries = json.loads(SOURCES.read_text())["charts"]
    return {
        (e["chart"], e["version"]): ChartSource(
            e["chart"],
            e["version"],
            e["dir"],
            e["repositories"],
            e.get("package", {}),
            e.get("releaseValues", {}),
        )
        for e in entries
    }


@dataclass(frozen=True)
class ReleaseRef:
    """What Pulumi's Helm Release asks Helm for."""

    release_name: str
    chart: str
    version: str
    repository: str
    namespace: str
    values: dict[str, Any]


def release_ref(inputs: dict[str, Any]) -> ReleaseRef:
    """The chart identity of a recorded Release's inputs; an `oci://registry/path/chart` reference carries
    its repository in the chart field (Pulumi passes it to Helm as is)."""
    chart = inputs["chart"]
    repository = (inputs.get("repositoryOpts") or {}).get("repo", "")
    if chart.startswith(OCI_SCHEME):
        repository, chart = chart.rsplit("/", 1)
    return ReleaseRef(
        release_name=inputs.get("name") or chart,
        chart=chart,
        version=inputs["version"],
        repository=repository,
        namespace=inputs.get("namespace") or "default",
        values=inputs.get("values") or {},
    )


@cache
def _tree_digest(root: Path) -> str:
    """One digest of every file under a pinned chart directory (paths and contents)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def source_problem(ref: ReleaseRef) -> str | None:
    """Why the plan's chart source cannot serve this chart version, or None when it can."""
    source = chart_sources().get((ref.chart, ref.version))
    if source is None:
        return f"{ref.chart} {ref.version} is not pinned under {CHARTS_ROOT} (add the chart and its sources)"
    record = source.repositories.get(ref.repository)
    if record is None:
        known = ", ".join(sorted(source.repositories))
        return f"{ref.repository} is not a known source of {ref.chart} {ref.version} (known: {known})"
    if record["status"] not in SERVING_STATUSES:
        return f"{ref.repository} does not serve {ref.chart} {ref.version}: {record['evidence']}"
    return None


class RenderError(Exception):
    """Helm refused to render a release (its message is Helm's)."""


class ChartRenderer:
    """Packages each pinned chart once, then renders releases from the packages."""

    def __init__(self, workdir: Path | None = None, cache_dir: Path | None = None):
        self._own_dir = None if workdir else tempfile.TemporaryDirectory(prefix="gpu-k8s-charts-")
        self.workdir = workdir or Path(self._own_dir.name)  # type: ignore[union-attr]
        self.helm = str(helm_binary())
        self.helm_digest = hashlib.sha256(Path(self.helm).read_bytes()).hexdigest()
        self.cache_dir = cache_dir
        self._packages: dict[tuple[str, str], Path] = {}
        self._renders: dict[str, str] = {}

    def package(self, chart: str, version: str) -> Path:
        key = (chart, version)
        if key not in self._packages:
            source = chart_sources()[key]
            out = self.workdir / "packages" / f"{chart}-{version}"
            out.mkdir(parents=True, exist_ok=True)
            flags = [f"--{k.replace('appVersion', 'app-version')}={v}" for k, v in source.package.items()]
            self._helm("package", str(CHARTS_ROOT / source.dir), "--destination", str(out), *flags)
            (self._packages[key],) = out.glob("*.tgz")
        return self._packages[key]

    def render(self, ref: ReleaseRef, kube_version: str, values: dict[str, Any] | None = None) -> str:
        """The manifests `helm install` would apply (CRDs included), as Helm prints them. A render is a pure
        function of the pinned chart, the release and the values: each is made once, and kept in
        `cache_dir` across runs when there is one."""
        chosen = ref.values if values is None else values
        key = self._render_key(ref, kube_version, chosen)
        if key in self._renders:
            return self._renders[key]
        cached = self.cache_dir / f"{key}.yaml" if self.cache_dir is not None else None
        if cached is not None and cached.is_file():
            self._renders[key] = cached.read_text()
            return self._renders[key]
        descriptor, name = tempfile.mkstemp(prefix="values-", suffix=".json", dir=self.workdir)
        values_file = Path(name)
        with open(descriptor, "w") as handle:
            json.dump(chosen, handle)
        try:
            text = self._helm(
                "template",
                ref.release_name,
                str(self.package(ref.chart, ref.version)),
                "--namespace",
                ref.namespace,
                "--kube-version",
                kube_version,
                "--include-crds",
                "--values",
                str(values_file),
            )
        finally:
            values_file.unlink()
        self._renders[key] = text
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            partial = cached.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(text)
            partial.replace(cached)
        return text

    def _render_key(self, ref: ReleaseRef, kube_version: str, values: dict[str, Any]) -> str:
        """What a render depends on: the chart's pinned files, the Helm binary, the release and the values."""
        source = chart_sources()[(ref.chart, ref.version)]
        identity = {
            "chart": _tree_digest(CHARTS_ROOT / source.dir),
            "package": source.package,
            "helm": self.helm_digest,
            "release": [ref.release_name, ref.namespace, kube_version],
            "values": values,
        }
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()

    def objects(self, ref: ReleaseRef, kube_version: str) -> list[dict[str, Any]]:
        return [doc for doc in yaml.load_all(self.render(ref, kube_version), Loader=ManifestLoader) if doc]

    def _helm(self, *args: str) -> str:
        # Helm's own state (repositories, cache, plugins) stays inside the work directory.
        env = {
            f"HELM_{kind}_HOME": str(self.workdir / "helm" / kind.lower())
            for kind in ("CACHE", "CONFIG", "DATA")
        }
        result = subprocess.run(
            [self.helm, *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "HELM_NO_PLUGINS": "1"},
        )
        if result.returncode != 0:
            raise RenderError(result.stderr.strip())
        return result.stdout

    def close(self) -> None:
        if self._own_dir is not None:
            self._own_dir.cleanup()
