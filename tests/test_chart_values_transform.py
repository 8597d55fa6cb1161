"""The README's way to change a chart value the config model does not offer: a Pulumi resource transform.
The mock engine runs no transforms, so the README's function is run here on the GPU Operator release as
the program registers it: a change of the release's type, chart name or values shape breaks this test
before it breaks a user's transform."""

from __future__ import annotations

import pulumi
import yaml

from gpu_k8s.tools.engine import Recording
from tests.paths import REPO_ROOT

HELM_RELEASE = "kubernetes:helm.sh/v3:Release"


def readme_transform():
    text = (REPO_ROOT / "README.md").read_text()
    block = text.split("<!-- chart-values-transform:start -->\n```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    # The example's last two lines register the transform and build the stack: not here.
    exec(
        compile(block.rsplit("\npulumi.runtime.register_resource_transform", 1)[0], "README.md", "exec"),
        namespace,
    )
    return namespace["gpu_operator_values"]


def test_the_readme_transform_changes_the_operator_values_and_nothing_else(aws_eks: Recording):
    transform = readme_transform()
    releases = aws_eks.by_type(HELM_RELEASE)
    (operator,) = [r for r in releases if r.inputs["chart"] == "gpu-operator"]
    opts = pulumi.ResourceOptions()
    result = transform(
        pulumi.ResourceTransformArgs(True, HELM_RELEASE, operator.name, dict(operator.inputs), opts)
    )
    assert result is not None and result.opts is opts
    assert result.props["values"]["dcgmExporter"] == {"enabled": False}
    assert {k: v for k, v in result.props["values"].items() if k != "dcgmExporter"} == {
        k: v for k, v in operator.inputs["values"].items() if k != "dcgmExporter"
    }
    # The pinned chart has the key the example sets.
    chart_values = yaml.safe_load(
        (REPO_ROOT / "upstream/charts/gpu-operator-v26.7.0/values.yaml").read_text()
    )
    assert "enabled" in chart_values["dcgmExporter"]
    for other in releases:
        if other is not operator:
            args = pulumi.ResourceTransformArgs(True, HELM_RELEASE, other.name, dict(other.inputs), opts)
            assert transform(args) is None
