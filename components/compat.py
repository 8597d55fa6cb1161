"""Driver, CUDA and container-toolkit compatibility, checked before anything is created.

A pod built for a CUDA release newer than the node's driver schedules fine and then crashes at its first
CUDA call; that is the most common GPU failure in Kubernetes. The facts here come from REFERENCE.md
section 10 (NVIDIA CUDA Toolkit release notes, Table 3, and the minor-version compatibility guide) and
section 1.1 (the components each GPU Operator chart pins, read from its values.yaml).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import total_ordering
from typing import Literal

from gpu_k8s.components.catalog import GpuModel
from gpu_k8s.components.configbase import ConfigIssue, StrictModel, config_path

DriverOwner = Literal["node-image", "cloud-installer", "gpu-operator"]

# Minimum Linux x86_64 driver of each CUDA release at GA ("Toolkit Driver Version", CUDA release notes
# Table 3). A driver at or above it runs everything the release builds, including PTX JIT.
CUDA_RELEASE_MINIMUM_DRIVER = {
    "13.2": "595.45.04",
    "13.1": "590.44.01",
    "13.0": "580.65.06",
    "12.9": "575.51.03",
    "12.8": "570.26",
    "12.6": "560.28.03",
    "12.5": "555.42.02",
    "12.4": "550.54.14",
    "12.3": "545.23.06",
    "12.2": "535.54.03",
    "12.1": "530.30.02",
    "12.0": "525.60.13",
    "11.8": "520.61.05",
}
# Minor-version compatibility floor of each CUDA major: any release of the family starts on a driver at or
# above it, without the features that need a newer driver (notably JIT of newer PTX).
CUDA_FAMILY_FLOOR = {13: "580", 12: "525.60.13", 11: "450.80.02"}
# CUDA 13.0 removed offline compilation and library support for these architectures (13.x release notes,
# "Deprecated Architectures").
CUDA13_DROPPED_ARCHITECTURES = ("maxwell", "pascal", "volta")
CUDA13_MIN_COMPUTE_CAPABILITY = (7, 5)

# NVIDIA Container Toolkit floor: 1.16.2 fixed the container escapes CVE-2024-0132/0133 (NVIDIA
# cloud-native-docs#106); 1.17.8 fixed CVE-2025-23266/23267 (the GPU Operator bumped to it in
# NVIDIA/gpu-operator#1466). RELIABILITY.md E14. The bulletin itself was not retrieved here.
TOOLKIT_FLOOR = "1.17.8"


@total_ordering
@dataclass(frozen=True)
class DriverVersion:
    """An NVIDIA driver version ("595.91.07"), or only its branch ("580") where a platform states no more.

    A bare branch compares by branch (EKS documents its AMIs' driver as "580", no patch level), so it
    passes a minimum on its own branch that its unknown patch level may miss; `unsure_of` says when.
    """

    parts: tuple[int, ...]
    # As NVIDIA writes it: patch levels keep their leading zero ("580.65.06").
    text: str = field(default="", compare=False)

    @classmethod
    def parse(cls, text: str) -> DriverVersion:
        if not re.fullmatch(r"\d+(\.\d+){0,2}", text):
            raise ValueError(f"not a driver version: {text!r}")
        return cls(tuple(int(part) for part in text.split(".")), text)

    @property
    def branch(self) -> int:
        return self.parts[0]

    def unsure_of(self, minimum: DriverVersion) -> bool:
        """Whether meeting `minimum` depends on a patch level this version does not state."""
        return len(self.parts) == 1 and len(minimum.parts) > 1 and self.branch == minimum.branch

    def _key(self, other: DriverVersion) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if len(self.parts) == 1 or len(other.parts) == 1:
            return (self.parts[:1], other.parts[:1])
        return (self.parts, other.parts)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, DriverVersion):
            return NotImplemented
        mine, theirs = self._key(other)
        return mine < theirs

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DriverVersion):
            return NotImplemented
        mine, theirs = self._key(other)
        return mine == theirs

    def __hash__(self) -> int:
        return hash(self.parts)

    def __str__(self) -> str:
        written = self.text or ".".join(str(part) for part in self.parts)
        return written if len(self.parts) > 1 else f"{written}.x"


@dataclass(frozen=True)
class OperatorRelease:
    """What one GPU Operator chart installs by default (its values.yaml)."""

    driver: str
    toolkit: str


GPU_OPERATOR_CHART_VERSION = "v26.7.0"
CLUSTER_AUTOSCALER_CHART_VERSION = "9.59.0"
# Helm chart versions are SemVer 2 (helm.sh docs, "The Chart.yaml File").
CHART_VERSION = re.compile(
    r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?", re.ASCII
)
# REFERENCE.md 1.1, read from deployments/gpu-operator/values.yaml at each tag.
OPERATOR_RELEASES = {
    "v26.7.0": OperatorRelease(driver="595.91.07", toolkit="1.20.0"),
    "v26.3.3": OperatorRelease(driver="580.126.20", toolkit="1.19.1"),
    "v26.3.0": OperatorRelease(driver="580.126.20", toolkit="1.19.0"),
    "v25.10.1": OperatorRelease(driver="580.105.08", toolkit="1.18.1"),
    "v25.10.0": OperatorRelease(driver="580.95.05", toolkit="1.18.0"),
    "v25.3.4": OperatorRelease(driver="580.82.07", toolkit="1.17.8"),
    "v25.3.0": OperatorRelease(driver="570.124.06", toolkit="1.17.5"),
    "v24.9.2": OperatorRelease(driver="550.144.03", toolkit="1.17.4"),
    "v24.6.2": OperatorRelease(driver="550.90.07", toolkit="1.16.2"),
    "v24.3.0": OperatorRelease(driver="550.54.15", toolkit="1.15.0"),
}


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def toolkit_is_patched(version: str) -> bool:
    return _version_tuple(version) >= _version_tuple(TOOLKIT_FLOOR)


def newest_cuda_fully_supported(driver: DriverVersion) -> str | None:
    """The newest CUDA release whose GA driver minimum this driver meets."""
    supported = [
        c for c, minimum in CUDA_RELEASE_MINIMUM_DRIVER.items() if driver >= DriverVersion.parse(minimum)
    ]
    return max(supported, key=_version_tuple, default=None)


@dataclass(frozen=True)
class DriverFacts:
    """Who installs the NVIDIA driver on a platform's GPU nodes, and which version it is."""

    owner: DriverOwner
    # None where the platform picks the driver as a node starts and no published table says which one
    # (GKE's installer); requirements on it are then warned about instead of checked.
    version: DriverVersion | None
    # How a user gets a newer driver on this platform, for error messages.
    upgrade_hint: str = "this platform's driver is fixed by its node image"
    # Names the installer more precisely than the owner does ("GKE's installer, DEFAULT channel").
    installer: str | None = None

    def describe(self) -> str:
        who = (
            self.installer
            or {
                "node-image": "the node image",
                "cloud-installer": "the cloud's installer",
                "gpu-operator": "the GPU Operator",
            }[self.owner]
        )
        if self.version is None:
            return f"a driver {who} chooses as each node starts"
        return f"driver {self.version} installed by {who}"

    @property
    def version_text(self) -> str:
        return str(self.version) if self.version is not None else f"chosen by {self.installer or self.owner}"


class AddonVersions(StrictModel):
    """`addonVersions`: chart versions; the defaults are the versions the contract tests check the rendered
    values against."""

    gpu_operator: str = GPU_OPERATOR_CHART_VERSION
    cluster_autoscaler: str = CLUSTER_AUTOSCALER_CHART_VERSION
    # The driver the GPU Operator installs, on platforms where it installs one (default: the chart's).
    nvidia_driver: str | None = None


def operator_driver(versions: AddonVersions) -> DriverVersion:
    """The driver the GPU Operator installs: the configured one, else the chart's pinned default."""
    return DriverVersion.parse(versions.nvidia_driver or OPERATOR_RELEASES[versions.gpu_operator].driver)


def addon_issues(versions: AddonVersions) -> Iterable[ConfigIssue]:
    """The GPU Operator release must be one whose bundled components are known and patched."""
    version = versions.gpu_operator
    release = OPERATOR_RELEASES.get(version)
    patched = [v for v, r in OPERATOR_RELEASES.items() if toolkit_is_patched(r.toolkit)]
    if release is None:
        yield ConfigIssue(
            config_path("addonVersions", "gpuOperator"),
            version,
            "not a GPU Operator release whose driver and container toolkit versions are known here",
            f"use one of: {', '.join(patched)} (or add the release to OPERATOR_RELEASES in "
            "components/compat.py from its values.yaml)",
        )
    elif not toolkit_is_patched(release.toolkit):
        yield ConfigIssue(
            config_path("addonVersions", "gpuOperator"),
            version,
            f"ships NVIDIA Container Toolkit {release.toolkit}, below the {TOOLKIT_FLOOR} floor "
            "(container-escape CVEs: CVE-2024-0132 fixed in 1.16.2, CVE-2025-23266 in 1.17.8)",
            f"use {patched[-1]} or newer; the default is {GPU_OPERATOR_CHART_VERSION}",
        )
    autoscaler = versions.cluster_autoscaler
    if not CHART_VERSION.fullmatch(autoscaler):
        yield ConfigIssue(
            config_path("addonVersions", "clusterAutoscaler"),
            autoscaler,
            "not a chart version (Helm charts carry SemVer 2 versions)",
            f'write a cluster-autoscaler chart release, e.g. "{CLUSTER_AUTOSCALER_CHART_VERSION}"',
        )
    driver = versions.nvidia_driver
    if driver is not None and not re.fullmatch(r"\d{3}\.\d+(\.\d+)?", driver):
        yield ConfigIssue(
            config_path("addonVersions", "nvidiaDriver"),
            driver,
            "not an NVIDIA driver version",
            'write the full version the driver container is tagged with, e.g. "580.126.20"',
        )


def _compute_capability(model: GpuModel) -> tuple[int, ...] | None:
    return _version_tuple(model.compute_capability) if model.compute_capability else None


@dataclass(frozen=True)
class PoolDriverCheck:
    """What the compatibility check needs to know about one GPU pool."""

    index: int
    name: str
    gpu_model: GpuModel
    uses_mig: bool
    # The newest CUDA the pool's workloads are built for (the pool's `cuda`, else the cluster's).
    cuda: str | None
    cuda_is_pool_override: bool


def driver_issues(
    versions: AddonVersions, driver: DriverFacts, pools: Iterable[PoolDriverCheck]
) -> tuple[list[ConfigIssue], list[ConfigIssue]]:
    """(errors, warnings) for the pools of a cluster whose GPU nodes run `driver`."""
    errors: list[ConfigIssue] = []
    warnings: list[ConfigIssue] = []
    if versions.nvidia_driver is not None and driver.owner != "gpu-operator":
        errors.append(
            ConfigIssue(
                config_path("addonVersions", "nvidiaDriver"),
                versions.nvidia_driver,
                f"the GPU Operator does not install this platform's driver (its GPU nodes run "
                f"{driver.describe()})",
                "remove addonVersions.nvidiaDriver",
            )
        )
    fix_driver = (
        "set addonVersions.nvidiaDriver to a newer driver or use a newer GPU Operator release"
        if driver.owner == "gpu-operator"
        else driver.upgrade_hint
    )
    # (YAML path, CUDA release) -> pools, for a driver whose version only a running node tells: one warning
    # per requirement, not one per pool.
    unchecked_cuda: dict[tuple[str, str], list[str]] = {}
    for pool in pools:
        model = pool.gpu_model
        if pool.uses_mig and model.min_mig_driver_version:
            minimum = DriverVersion.parse(model.min_mig_driver_version)
            mig_issue = ConfigIssue(
                config_path("gpuPools", pool.index, "sharing", "mode"),
                "mig",
                f'pool "{pool.name}": MIG on {model.display_name} needs driver >= {minimum}; '
                f"the nodes run {driver.describe()}",
                f"{fix_driver}, or use another sharing mode",
            )
            if driver.version is None:
                warnings.append(_unknown(mig_issue))
            elif driver.version < minimum:
                errors.append(mig_issue)
            elif driver.version.unsure_of(minimum):
                warnings.append(_unsure(mig_issue))
        if pool.cuda is None:
            continue
        path = (
            config_path("gpuPools", pool.index, "cuda") if pool.cuda_is_pool_override else config_path("cuda")
        )
        major = int(pool.cuda.split(".")[0])
        if driver.version is None:
            unchecked_cuda.setdefault((path, pool.cuda), []).append(pool.name)
        else:
            errors_, warnings_ = _cuda_driver_issues(pool, path, driver, fix_driver)
            errors.extend(errors_)
            warnings.extend(warnings_)
        capability = _compute_capability(model)
        dropped = model.architecture in CUDA13_DROPPED_ARCHITECTURES or (
            capability is not None and capability < CUDA13_MIN_COMPUTE_CAPABILITY
        )
        if major >= 13 and (dropped or (model.architecture is None and capability is None)):
            known = "" if model.architecture is None and capability is None else f" ({model.architecture})"
            errors.append(
                ConfigIssue(
                    path,
                    pool.cuda,
                    f'pool "{pool.name}": CUDA 13 dropped Maxwell, Pascal and Volta; '
                    f"{model.display_name}{known} "
                    + ("is one of them" if known else "has no known architecture in the catalog"),
                    "build this pool's workloads for CUDA 12.x (set the pool's cuda), or use a newer GPU",
                )
            )
    for (path, cuda), names in unchecked_cuda.items():
        major = int(cuda.split(".")[0])
        listed = ", ".join(f'"{name}"' for name in names)
        warnings.append(
            _unknown(
                ConfigIssue(
                    path,
                    cuda,
                    f"pool{'s' if len(names) > 1 else ''} {listed}: CUDA {cuda} wants "
                    f"driver >= {CUDA_RELEASE_MINIMUM_DRIVER[cuda]} (CUDA {major}.x at least "
                    f"{CUDA_FAMILY_FLOOR[major]}); the nodes run {driver.describe()}",
                    fix_driver,
                )
            )
        )
    return errors, warnings


def _cuda_driver_issues(
    pool: PoolDriverCheck, path: str, driver: DriverFacts, fix_driver: str
) -> tuple[list[ConfigIssue], list[ConfigIssue]]:
    """(errors, warnings) for a pool's CUDA release on a driver whose version is known."""
    assert driver.version is not None and pool.cuda is not None
    major = int(pool.cuda.split(".")[0])
    newest = newest_cuda_fully_supported(driver.version)
    floor = DriverVersion.parse(CUDA_FAMILY_FLOOR[major])
    release_minimum = DriverVersion.parse(CUDA_RELEASE_MINIMUM_DRIVER[pool.cuda])
    if driver.version < floor:
        return [
            ConfigIssue(
                path,
                pool.cuda,
                f'pool "{pool.name}": CUDA {major}.x needs driver >= {floor}; the nodes run '
                f"{driver.describe()}, so CUDA calls fail with 'driver version is insufficient'",
                f"build the workloads for CUDA {newest} or older, or {fix_driver}",
            )
        ], []
    if driver.version < release_minimum:
        return [], [
            ConfigIssue(
                path,
                pool.cuda,
                f'pool "{pool.name}": CUDA {pool.cuda} wants driver >= {release_minimum}; on '
                f"{driver.describe()} it runs only under minor-version compatibility (no JIT of newer "
                "PTX, newer driver APIs fail)",
                f"build for CUDA {newest} to be fully supported, or ship SASS for the pool's GPU",
            )
        ]
    if driver.version.unsure_of(release_minimum):
        return [], [
            _unsure(
                ConfigIssue(
                    path,
                    pool.cuda,
                    f'pool "{pool.name}": CUDA {pool.cuda} wants driver >= {release_minimum}; the nodes '
                    f"run {driver.describe()}",
                    f"or build for CUDA {_newest_older(pool.cuda) or 'an older release'}",
                )
            )
        ]
    return [], []


def _unconfirmed(issue: ConfigIssue, why: str, how_to_check: str) -> ConfigIssue:
    """A requirement the platform's driver facts cannot settle, turned into a warning that says why and
    how to check it."""
    return ConfigIssue(issue.path, issue.value, issue.problem + why, f"{how_to_check}{issue.fix}")


def _unknown(issue: ConfigIssue) -> ConfigIssue:
    """For a driver the platform chooses only when a node starts."""
    return _unconfirmed(
        issue,
        "; which driver that is cannot be known before a node runs",
        "check `nvidia-smi` on the first node, or ",
    )


def _unsure(issue: ConfigIssue) -> ConfigIssue:
    """For a same-branch minimum that a driver stated only by its branch may miss."""
    return _unconfirmed(
        issue,
        " (the platform states only the branch, so the patch level is unconfirmed)",
        "check the node image's release notes for its exact driver, ",
    )


def _newest_older(cuda: str) -> str | None:
    """The newest listed CUDA release before `cuda`."""
    older = [c for c in CUDA_RELEASE_MINIMUM_DRIVER if _version_tuple(c) < _version_tuple(cuda)]
    return max(older, key=_version_tuple, default=None)


def cuda_version_issue(path: str, value: str) -> ConfigIssue | None:
    if value not in CUDA_RELEASE_MINIMUM_DRIVER:
        known = ", ".join(sorted(CUDA_RELEASE_MINIMUM_DRIVER, key=_version_tuple))
        return ConfigIssue(
            path,
            value,
            "not a CUDA release with a known minimum driver",
            f"use the release the workloads are built with (or the next newer listed one): {known}",
        )
    return None
