"""Upgrading running k3s servers: system-upgrade-controller as its release ships it, the Plan CRD, and a
servers-only Plan whose version is `k3s.version` (validated against the CRD's own schema)."""

from __future__ import annotations

import copy

import jsonschema
import kubernetes_validate
import pytest

from gpu_k8s.components.k3s import upgrades
from gpu_k8s.components.spec import SUPPORTED_KUBERNETES_MINORS
from gpu_k8s.tools.engine import Recording, Registration, run_program
from tests.test_charts import crd_schemas

SERVER_TOLERATIONS = [{"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoExecute"}]


def plan_validator():
    schemas = crd_schemas([upgrades.plan_crd()])
    (schema,) = (
        s for (api, kind, _), s in schemas.items() if (api, kind) == ("upgrade.cattle.io/v1", "Plan")
    )
    return jsonschema.validators.validator_for(schema)(schema)


def test_the_server_plan_is_valid_for_the_plan_crd():
    plan = upgrades.server_plan("v1.36.3+k3s1", "system-upgrade", SERVER_TOLERATIONS)
    assert list(plan_validator().iter_errors(plan)) == []


def test_the_crd_check_refuses_a_misspelt_plan_field():
    plan = upgrades.server_plan("v1.36.3+k3s1", "system-upgrade", SERVER_TOLERATIONS)
    plan["spec"]["concurency"] = plan["spec"].pop("concurrency")
    assert list(plan_validator().iter_errors(plan))


@pytest.mark.parametrize("minor", SUPPORTED_KUBERNETES_MINORS)
def test_the_controller_objects_pass_strict_schema_validation(minor):
    for manifest in [*upgrades.controller_manifests(), upgrades.plan_crd()]:
        kubernetes_validate.validate(manifest, f"{minor}.0", strict=True)


def test_the_controller_is_the_release_asset():
    """kustomize's namespace and image transformers, as scripts/package-controller runs them at the tag."""
    manifests = upgrades.controller_manifests()
    assert {
        m["metadata"].get("namespace") for m in manifests if m["kind"] in ("Deployment", "ConfigMap")
    } == {"system-upgrade"}
    (deployment,) = [m for m in manifests if m["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "rancher/system-upgrade-controller:v0.20.1"
    # It runs on the servers, which only critical add-ons tolerate.
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in pod["tolerations"]
    bindings = [m for m in manifests if m["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert bindings and all(s["namespace"] == "system-upgrade" for b in bindings for s in b["subjects"])


def plan_of(rec: Recording) -> Registration:
    (plan,) = rec.by_type("kubernetes:upgrade.cattle.io/v1:Plan")
    return plan


@pytest.mark.parametrize("stack", ["aws_k3s", "gcp_k3s"])
def test_each_k3s_stack_upgrades_its_servers_one_at_a_time_to_its_k3s_version(request, stack):
    rec = request.getfixturevalue(stack)
    config = request.getfixturevalue(f"{stack}_config")
    spec = plan_of(rec).inputs["spec"]
    assert spec["version"] == config["gpu-k8s:cluster"]["k3s"]["version"]
    assert spec["concurrency"] == 1 and spec["cordon"] is True and "drain" not in spec
    assert spec["nodeSelector"] == {
        "matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]
    }
    assert {"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoExecute"} in spec["tolerations"]
    # GPU agents get no Plan: they take the new version when they are next created.
    assert len(rec.by_type("kubernetes:upgrade.cattle.io/v1:Plan")) == 1
    plan = plan_of(rec)
    crd = next(r for r in rec.by_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"))
    assert crd.urn in plan.dependencies


def test_a_k3s_version_bump_moves_the_plan_and_new_agents_and_leaves_running_servers_alone(aws_k3s_config):
    bumped = copy.deepcopy(aws_k3s_config)
    bumped["gpu-k8s:cluster"]["k3s"]["version"] = "v1.36.4+k3s1"
    before, after = run_program("before", aws_k3s_config), run_program("after", bumped)
    assert plan_of(after).inputs["spec"]["version"] == "v1.36.4+k3s1"
    for index in range(3):
        old, new = before.by_name(f"ml-server-{index}"), after.by_name(f"ml-server-{index}")
        # The user data changes, and is ignored on running servers: the Plan upgrades them in place.
        assert old.inputs["userDataBase64"] != new.inputs["userDataBase64"]
        assert "userDataBase64" in new.options["ignoreChanges"]
        changed = {k for k in {*old.inputs, *new.inputs} if old.inputs.get(k) != new.inputs.get(k)}
        assert changed == {"userDataBase64"}
    template = after.by_name("ml-gpu-l4-lt").inputs["userData"]
    assert template != before.by_name("ml-gpu-l4-lt").inputs["userData"]
