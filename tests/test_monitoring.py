"""`monitoring`: kube-prometheus-stack, the DCGM exporter scraped with a `node` label, and the GPU alerts.

The alerts are checked by their real consumer: Prometheus' `promtool` (Debian's `prometheus` package, which
.ci/run installs) parses the rules and runs unit tests of each alert against synthetic series written here.
The PrometheusRule object is validated against the CRD of the pinned chart.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpu_k8s.components.cluster import PlatformTraits
from gpu_k8s.components.compat import DriverFacts
from gpu_k8s.components.k3s.admission import POLICY_NAME as SERVER_POLICY
from gpu_k8s.components.monitoring import (
    GPU_REQUESTS,
    MONITORING_NAMESPACE,
    gpu_alert_rules,
    prometheus_rule_manifest,
    stack_values,
)
from gpu_k8s.components.monitoring_spec import GpuAlertsSpec, MonitoringSpec, prometheus_duration_seconds
from gpu_k8s.components.spec import TaintSpec
from gpu_k8s.tools.charts import CHARTS_ROOT
from gpu_k8s.tools.costs import idle_charges
from gpu_k8s.tools.engine import Recording, run_program
from tests.conftest import (
    HELM_RELEASE,
    assert_refused_before_any_resource,
    planned_admission_policy,
    set_path,
    some,
    upstream,
)
from tests.test_charts import crd_schemas, validate_custom_resource

CHART_DIR = CHARTS_ROOT / "kube-prometheus-stack-88.5.3"
SG_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"


def traits(**changes: Any) -> PlatformTraits:
    driver = DriverFacts(owner="gpu-operator", version=None)
    return PlatformTraits(driver=driver, toolkit_preinstalled=False, accelerator_label=None, **changes)


def releases(recording: Recording) -> dict[str, Any]:
    return {r.inputs["chart"]: r for r in recording.by_type(HELM_RELEASE)}


def test_monitoring_installs_the_pinned_stack_before_the_operator_whose_exporter_it_scrapes(aws_eks):
    by_chart = releases(aws_eks)
    stack, operator = by_chart["kube-prometheus-stack"], by_chart["gpu-operator"]
    assert stack.inputs["version"] == "88.5.3"
    assert stack.inputs["repositoryOpts"] == {"repo": "https://prometheus-community.github.io/helm-charts"}
    assert stack.inputs["namespace"] == "monitoring"
    assert stack.urn in operator.dependencies
    # The exporter maps GPUs to pods by UUID, which the GPU Operator's own device plugin hands out.
    assert "env" not in operator.inputs["values"]["dcgmExporter"]
    monitor = operator.inputs["values"]["dcgmExporter"]["serviceMonitor"]
    assert "enabled" not in monitor  # the chart's default, true
    assert monitor["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"}
    ]
    rule = aws_eks.by_name("ml-monitoring-gpu-alerts")
    assert stack.urn in rule.dependencies
    namespace = aws_eks.by_name("ml-monitoring-namespace")
    assert namespace.inputs["metadata"]["labels"] == {"pod-security.kubernetes.io/enforce": "privileged"}


def test_monitoring_is_on_unless_the_stack_says_false(gcp_gke, gcp_gke_config):
    assert "monitoring" not in gcp_gke_config["gpu-k8s:cluster"]
    assert "kube-prometheus-stack" in releases(gcp_gke)


def test_without_monitoring_nothing_of_it_is_made_and_the_exporter_is_not_scraped(gcp_gke_unmonitored):
    assert "kube-prometheus-stack" not in releases(gcp_gke_unmonitored)
    assert not [r for r in gcp_gke_unmonitored.registrations if "monitoring.coreos.com" in r.type]
    operator = releases(gcp_gke_unmonitored)["gpu-operator"]
    assert operator.inputs["values"]["dcgmExporter"]["serviceMonitor"] == {"enabled": False}
    assert "monitoring" not in gcp_gke_unmonitored.outputs


def test_gke_with_monitoring_gets_the_same_stack(gcp_gke_config):
    config = copy.deepcopy(gcp_gke_config)
    config["gpu-k8s:cluster"]["monitoring"] = None  # `monitoring:` alone: the defaults
    recording = run_program("gcp-gke", config)
    stack = releases(recording)["kube-prometheus-stack"]
    spec = stack.inputs["values"]["prometheus"]["prometheusSpec"]
    assert spec["retention"] == "15d" and spec["retentionSize"] == "16GiB"
    assert spec["storageSpec"]["volumeClaimTemplate"]["spec"]["resources"] == {
        "requests": {"storage": "20Gi"}
    }
    assert stack.urn in releases(recording)["gpu-operator"].dependencies
    # GKE runs kube-dns, which serves no CoreDNS metrics port: no target that is always down.
    assert stack.inputs["values"]["coreDns"] == {"enabled": False}


def test_k3s_lets_the_monitoring_namespace_run_on_the_servers_and_tolerate_them(gcp_k3s):
    policy = planned_admission_policy(gcp_k3s, SERVER_POLICY)
    selector = policy["spec"]["matchConstraints"]["namespaceSelector"]
    (exempt,) = [e["values"] for e in selector["matchExpressions"] if e["operator"] == "NotIn"]
    assert MONITORING_NAMESPACE in exempt
    values = releases(gcp_k3s)["kube-prometheus-stack"].inputs["values"]
    tolerations = values["prometheus"]["prometheusSpec"]["tolerations"]
    assert tolerations and tolerations == values["prometheusOperator"]["tolerations"]
    assert tolerations == values["kube-state-metrics"]["tolerations"]


def test_values_keep_node_exporter_off_the_hosts_root_and_the_volume_with_the_server():
    values = stack_values(MonitoringSpec(storage_gib=50, retention="30d"), traits())
    assert values["prometheus-node-exporter"] == {"hostRootFsMount": {"enabled": False}}
    # kube-state-metrics lists and watches no Secret, and copies each node's pool into kube_node_labels.
    assert values["kube-state-metrics"] == {
        "collectorsExclude": ["secrets"],
        "metricLabelsAllowlist": ["nodes=[gpu-k8s.io/pool]"],
    }
    assert "coreDns" not in values
    spec = values["prometheus"]["prometheusSpec"]
    assert spec["retentionSize"] == "40GiB" and spec["retention"] == "30d"
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Delete", "whenScaled": "Retain"}
    # No tolerations where the add-ons need none (EKS system nodes are untainted): nothing set that the
    # chart's default already says.
    assert "tolerations" not in spec and "prometheusOperator" not in values


def test_every_value_set_is_a_key_of_the_pinned_chart():
    chart_values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    subchart_values = {
        name: yaml.safe_load((CHART_DIR / "charts" / name / "values.yaml").read_text())
        for name in ("kube-state-metrics", "prometheus-node-exporter", "grafana")
    }

    def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        """A subchart's values as the parent chart's own `<subchart>:` section extends them."""
        out = dict(base)
        for key, value in over.items():
            both = isinstance(value, dict) and isinstance(out.get(key), dict)
            out[key] = merged(out[key], value) if both else value
        return out

    subchart_values = {
        name: merged(sub, chart_values.get(name) or {}) for name, sub in subchart_values.items()
    }

    def walk(given: dict[str, Any], known: dict[str, Any], path: str) -> None:
        for key, value in given.items():
            assert key in known, f"{path}{key} is not a value of the chart"
            # grafana.ini is Grafana's own configuration file, written as given, not chart values.
            nested = isinstance(value, dict) and isinstance(known[key], dict) and known[key]
            if nested and key != "grafana.ini":
                walk(value, known[key], f"{path}{key}.")

    taint = TaintSpec(key="k", value="v", effect="NoExecute")
    values = stack_values(MonitoringSpec(), traits(system_taint=taint, cluster_dns="kube-dns"))
    for name, sub in subchart_values.items():
        walk(values.pop(name), sub, f"{name}.")
    walk(values, chart_values, "")


def test_the_rule_object_is_valid_against_the_pinned_crd():
    crd = yaml.safe_load((CHART_DIR / "charts/crds/crds/crd-prometheusrules.yaml").read_text())
    schemas = crd_schemas([crd])
    manifest = prometheus_rule_manifest(GpuAlertsSpec())
    validate_custom_resource(manifest, schemas)
    misspelt = {**manifest, "spec": {"groups": [{**manifest["spec"]["groups"][0], "rule": []}]}}
    with pytest.raises(jsonschema.ValidationError):
        validate_custom_resource(misspelt, schemas)


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        ("monitoring.retention", "15 days", ["not a Prometheus duration"]),
        # Units out of order or twice: the Prometheus Operator's CRDs refuse them.
        ("monitoring.retention", "30m1d", ["not a Prometheus duration"]),
        ("monitoring.alerts.gpuIdleFor", "1h1h", ["not a Prometheus duration"]),
        ("monitoring.retention", "1h", ["shorter than 120 minutes", "smallest block"]),
        ("monitoring.alerts.gpuIdleFor", "90ms", ["not a Prometheus duration"]),
        ("monitoring.alerts.gpuIdleFor", "1m", ["shorter than 5 minutes"]),
        ("monitoring.alerts.gpuPodPendingFor", "30s", ["shorter than 1 minutes"]),
        ("monitoring.alerts.gpuMemoryFullFor", "soon", ["not a Prometheus duration"]),
    ],
)
def test_bad_monitoring_durations_are_refused_before_any_resource(aws_eks_config, path, value, words):
    config = copy.deepcopy(aws_eks_config)
    config["gpu-k8s:cluster"]["monitoring"] = {"alerts": {}}
    assert_refused_before_any_resource(config, set_path(path, value), path, words)


def test_prometheus_durations_are_read_as_prometheus_reads_them():
    assert prometheus_duration_seconds("1h30m") == 5400
    assert prometheus_duration_seconds("2w") == 14 * 86400
    assert prometheus_duration_seconds("") is None
    assert prometheus_duration_seconds("1.5h") is None
    assert prometheus_duration_seconds("1d2h") == 93600 and prometheus_duration_seconds("2h1d") is None


# --- the alerts, run by promtool -------------------------------------------------------------------------


def promtool(tmp_path: Path, command: str, document: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """Run `promtool <command>` on `document`; skips where promtool is missing, fails so in CI."""
    found = shutil.which("promtool")
    if found is None:
        missing = "promtool is not installed (apt-get install prometheus; .ci/run does)"
        if os.environ.get("CI") == "true":
            pytest.fail(missing)
        pytest.skip(missing)
    path = tmp_path / f"{command.replace(' ', '-')}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return subprocess.run(
        [found, *command.split(), path.name], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )


def test_promtool_accepts_the_rules(tmp_path: Path):
    result = promtool(tmp_path, "check rules", {"groups": gpu_alert_rules(GpuAlertsSpec())})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 5 rules found" in result.stdout


def fired(name: str, at: str, *alerts: dict[str, Any]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": name, "exp_alerts": list(alerts)}


def assert_alerts(
    tmp_path: Path, groups: list[dict[str, Any]], series: list[dict[str, str]], expected: list[dict[str, Any]]
) -> None:
    """`promtool test rules`: the rule `groups` over `series` (one sample a minute) fire as `expected`."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    result = promtool(tmp_path, "test rules", rule_tests(series, alert_rule_test=expected))
    assert result.returncode == 0, result.stdout + result.stderr


def rule_tests(series: list[dict[str, str]], **checks: list[dict[str, Any]]) -> dict[str, Any]:
    """A `promtool test rules` document over rules.yaml: `series` sampled once a minute, then `checks`
    (alert_rule_test, promql_expr_test)."""
    return {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, **checks}],
    }


def test_each_alert_fires_after_its_threshold_and_not_before(tmp_path: Path):
    alerts = GpuAlertsSpec(gpu_idle_for="1h", gpu_pod_pending_for="30m", gpu_memory_full_for="15m")

    def dcgm(field: str, node: str, gpu: str) -> str:
        return f'DCGM_FI_{field}{{node="{node}",gpu="{gpu}",job="nvidia-dcgm-exporter"}}'

    def requests(pod: str, node: str, resource: str) -> str:
        return (
            f'kube_pod_container_resource_requests{{namespace="research",pod="{pod}",container="main",'
            f'node="{node}",resource="{resource}",unit="integer"}}'
        )

    def phase(pod: str, value: str) -> str:
        return f'kube_pod_status_phase{{namespace="research",pod="{pod}",phase="{value}"}}'

    series = [
        # gpu-1: both GPUs idle for two hours, one held by the running pod `notebook`: idle and paid for.
        {"series": dcgm("PROF_GR_ENGINE_ACTIVE", "gpu-1", "0"), "values": "0x120"},
        {"series": dcgm("PROF_GR_ENGINE_ACTIVE", "gpu-1", "1"), "values": "0.001x120"},
        {"series": requests("notebook", "gpu-1", "nvidia_com_gpu"), "values": "1x120"},
        {"series": phase("notebook", "Running"), "values": "1x120"},
        # gpu-2: one GPU busy, held by `train-0`: not idle.
        {"series": dcgm("PROF_GR_ENGINE_ACTIVE", "gpu-2", "0"), "values": "0x120"},
        {"series": dcgm("PROF_GR_ENGINE_ACTIVE", "gpu-2", "1"), "values": "0.8x120"},
        {"series": requests("train-0", "gpu-2", "nvidia_com_gpu"), "values": "2x120"},
        {"series": phase("train-0", "Running"), "values": "1x120"},
        # gpu-3: idle with no pod on it: the autoscaler's to remove (or kept by minNodes), not this alert's.
        {"series": dcgm("PROF_GR_ENGINE_ACTIVE", "gpu-3", "0"), "values": "0x120"},
        # gpu-1 GPU 0: 96% of its memory used; GPU 1: 50%.
        {"series": dcgm("DEV_FB_USED", "gpu-1", "0"), "values": "96x120"},
        {"series": dcgm("DEV_FB_FREE", "gpu-1", "0"), "values": "4x120"},
        {"series": dcgm("DEV_FB_USED", "gpu-1", "1"), "values": "50x120"},
        {"series": dcgm("DEV_FB_FREE", "gpu-1", "1"), "values": "50x120"},
        # Xid 79 (fallen off the bus) on gpu-1 GPU 1 from minute 10; Xid 13 (a program's own fault) on gpu-2.
        {"series": dcgm("DEV_XID_ERRORS", "gpu-1", "1"), "values": "0x9 79x110"},
        {"series": dcgm("DEV_XID_ERRORS", "gpu-2", "0"), "values": "13x120"},
        {"series": dcgm("DEV_ROW_REMAP_FAILURE", "gpu-1", "1"), "values": "0x120"},
        # `big` asks for 8 GPUs and no node can take it; `slot` for a shared slot and waits 20 minutes
        # only; `web` asks for CPU; `queued` is held by Kueue (a scheduling gate, never unschedulable).
        {"series": requests("big", "", "nvidia_com_gpu"), "values": "8x120"},
        {"series": 'kube_pod_status_unschedulable{namespace="research",pod="big"}', "values": "1x120"},
        {"series": requests("slot", "", "nvidia_com_gpu_shared"), "values": "1x120"},
        {"series": 'kube_pod_status_unschedulable{namespace="research",pod="slot"}', "values": "1x20 _x100"},
        {"series": requests("web", "", "cpu"), "values": "1x120"},
        {"series": 'kube_pod_status_unschedulable{namespace="research",pod="web"}', "values": "1x120"},
        {"series": requests("queued", "", "nvidia_com_gpu"), "values": "4x120"},
        {"series": phase("queued", "Pending"), "values": "1x120"},
    ]
    idle = {
        "exp_labels": {"alertname": "GpuNodeIdle", "severity": "warning", "node": "gpu-1"},
        "exp_annotations": {
            "summary": "Every GPU of node gpu-1 has been idle for 1h",
            "description": "A running pod holds GPUs of this node without using them, so the autoscaler "
            "keeps the node and it bills. Find the pods: kubectl get pods -A --field-selector "
            "spec.nodeName=gpu-1",
        },
    }
    memory = {
        "exp_labels": {
            "alertname": "GpuMemoryNearlyFull",
            "severity": "warning",
            "node": "gpu-1",
            "gpu": "0",
        },
        "exp_annotations": {"summary": "GPU 0 on gpu-1 is over 95% of its memory"},
    }
    xid = {
        "exp_labels": {"alertname": "GpuXidError", "severity": "critical", "node": "gpu-1", "gpu": "1"},
        "exp_annotations": {
            "summary": "GPU 1 on gpu-1 reported Xid 79",
            "description": "The driver reported a fault after which the GPU needs a reset: drain the node "
            "(the alert stays until the DCGM exporter restarts, as its value is the last Xid).",
        },
    }
    pending = {
        "exp_labels": {
            "alertname": "GpuPodPending",
            "severity": "warning",
            "namespace": "research",
            "pod": "big",
        },
        "exp_annotations": {
            "summary": "research/big has waited 30m for a node with 8 GPU slot(s)",
            "description": "kubectl describe pod says why: no node of that shape, a pool at maxNodes, no "
            "cloud capacity (the autoscaler's events), or a quota.",
        },
    }
    assert_alerts(
        tmp_path,
        gpu_alert_rules(alerts),
        series,
        [
            fired("GpuNodeIdle", "59m"),
            fired("GpuNodeIdle", "61m", idle),
            fired("GpuMemoryNearlyFull", "14m"),
            fired("GpuMemoryNearlyFull", "16m", memory),
            fired("GpuXidError", "9m"),
            fired("GpuXidError", "10m", xid),
            fired("GpuXidError", "100m", xid),
            fired("GpuRowRemapFailed", "100m"),
            fired("GpuPodPending", "29m"),
            fired("GpuPodPending", "31m", pending),
        ],
    )


def test_aws_k3s_with_monitoring_opens_node_exporter_between_the_nodes_only(aws_k3s, aws_k3s_unmonitored):
    """node-exporter listens on each node's own address; Prometheus on a server reaches it across nodes."""
    assert not [r for r in aws_k3s_unmonitored.by_type(SG_RULE) if r.inputs["fromPort"] == 9100]
    (rule,) = [r for r in aws_k3s.by_type(SG_RULE) if r.inputs["fromPort"] == 9100]
    nodes = aws_k3s.by_name("ml-nodes-sg")
    assert rule.inputs["toPort"] == 9100 and rule.inputs["ipProtocol"] == "tcp"
    assert rule.inputs["securityGroupId"] == nodes.id
    assert rule.inputs["referencedSecurityGroupId"] == nodes.id
    assert "cidrIpv4" not in rule.inputs


def test_kueue_and_the_autoscaler_are_scraped_after_the_stack_that_brings_the_crd(aws_eks):
    by_chart = releases(aws_eks)
    stack = by_chart["kube-prometheus-stack"]
    kueue = by_chart["oci://registry.k8s.io/kueue/charts/kueue"]
    autoscaler = by_chart["cluster-autoscaler"]
    assert kueue.inputs["values"]["enablePrometheus"] is True and stack.urn in kueue.dependencies
    assert autoscaler.inputs["values"]["serviceMonitor"] == {"enabled": True}
    assert stack.urn in autoscaler.dependencies
    groups = aws_eks.by_name("ml-monitoring-gpu-alerts").inputs["spec"]["groups"]
    capacity = {rule["alert"] for g in groups if g["name"] == "gpu-k8s.capacity" for rule in g["rules"]}
    assert capacity == {"KueueQueueStalled", "GpuScaleUpFailed"}


def test_without_monitoring_kueue_and_the_autoscaler_create_no_servicemonitor(aws_k3s_unmonitored):
    by_chart = releases(aws_k3s_unmonitored)
    assert "serviceMonitor" not in by_chart["cluster-autoscaler"].inputs["values"]


def test_gke_alerts_on_its_queues_but_not_on_an_autoscaler_it_does_not_run(gcp_gke_config):
    config = copy.deepcopy(gcp_gke_config)
    config["gpu-k8s:cluster"]["monitoring"] = {}
    config["gpu-k8s:cluster"]["batch"] = {"namespaces": ["research"]}
    recording = run_program("gcp-gke", config)
    kueue = releases(recording)["oci://registry.k8s.io/kueue/charts/kueue"]
    assert kueue.inputs["values"]["enablePrometheus"] is True
    groups = recording.by_name("ml-monitoring-gpu-alerts").inputs["spec"]["groups"]
    capacity = {rule["alert"] for g in groups if g["name"] == "gpu-k8s.capacity" for rule in g["rules"]}
    assert capacity == {"KueueQueueStalled"}


def test_the_queue_and_autoscaler_alerts_fire_as_promtool_evaluates_them(tmp_path: Path):
    manifest = prometheus_rule_manifest(GpuAlertsSpec(queue_stalled_for="30m"), queued=True, autoscaled=True)
    pending = 'kueue_pending_workloads{{cluster_queue="{queue}",status="{status}",replica_role="standalone"}}'
    admitted = 'kueue_admitted_workloads_total{{cluster_queue="{queue}",replica_role="standalone"}}'
    series = [
        # h100: two workloads wait from the start and nothing is admitted.
        {"series": pending.format(queue="h100", status="inadmissible"), "values": "2x120"},
        # l4: workloads wait, but the queue admits one every 10 minutes: moving, not stalled.
        {"series": pending.format(queue="l4", status="active"), "values": "3x120"},
        {"series": admitted.format(queue="l4"), "values": "0+0.1x120"},
        # Two failed scale-ups (no capacity) at minutes 40 and 41.
        {
            "series": 'cluster_autoscaler_failed_scale_ups_total{reason="cloudProviderError"}',
            "values": "0x39 1 2x80",
        },
    ]
    stalled = {
        "exp_labels": {"alertname": "KueueQueueStalled", "severity": "warning", "cluster_queue": "h100"},
        "exp_annotations": {
            "summary": "ClusterQueue h100 has 2 workload(s) waiting and admitted none for 30m",
            "description": "kubectl describe clusterqueue h100: its quota held by running jobs, a workload "
            "larger than the quota, or a provisioning request the cloud cannot fill (kubectl get "
            "provisioningrequests -A).",
        },
    }
    failed = {
        "exp_labels": {
            "alertname": "GpuScaleUpFailed",
            "severity": "warning",
            "reason": "cloudProviderError",
        },
        "exp_annotations": {
            "summary": "The cluster-autoscaler failed 2 scale-up(s) in 15 minutes: cloudProviderError",
            "description": "Usually no capacity or quota for the instance type in the pool's zones; kubectl "
            "-n kube-system get configmap cluster-autoscaler-status -o yaml says which group and why.",
        },
    }
    assert_alerts(
        tmp_path,
        manifest["spec"]["groups"],
        series,
        [
            fired("KueueQueueStalled", "29m"),
            fired("KueueQueueStalled", "31m", stalled),
            fired("GpuScaleUpFailed", "30m"),
            fired("GpuScaleUpFailed", "45m", failed),
            fired("GpuScaleUpFailed", "70m"),
        ],
    )


# --- the series the alerts read, against what their exporters publish ---------------------------------------

# PromQL words that are not series, and the label lists they take (`by (node)`, `on (pod)`).
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset"}
LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def rule_metric_names(expr: str) -> set[str]:
    """The series an expression reads: names left once strings, label matchers, ranges and label lists are
    dropped that are neither a function call nor a keyword."""
    bare = LABEL_LISTS.sub("", re.sub(r'"[^"]*"|\{[^}]*\}|\[[^\]]*\]', "", expr))
    names = re.findall(r"\b([A-Za-z_:][A-Za-z0-9_:]*)\b(?!\s*\()", bare)
    return {name for name in names if name not in PROMQL_KEYWORDS}


def dcgm_fields() -> set[str]:
    """The fields the GPU Operator's exporter collects: v26.7.0 sets DCGM_EXPORTER_COLLECTORS to the image's
    dcp-metrics-included.csv (assets/state-dcgm-exporter/0800_daemonset.yaml); lines starting # are off."""
    rows = upstream("dcgm-exporter/4.5.3-4.8.2/dcp-metrics-included.csv").read_text().splitlines()
    return {row.split(",")[0].strip() for row in rows if row.strip() and not row.startswith("#")}


def kube_state_metrics_series() -> set[str]:
    """The pod and node series of kube-state-metrics v2.20.0 (the kube-prometheus-stack 88.5.3 subchart's
    appVersion), from its metrics tables."""
    names: set[str] = set()
    for kind in ("pod", "node"):
        table = upstream(f"kube-state-metrics/v2.20.0/{kind}-metrics.md").read_text()
        names |= set(re.findall(r"^\|\s*(kube_[a-z_]+)\s*\|", table, re.MULTILINE))
    return names


def go_metric_names(relative_path: str, prefix_of: dict[str, str]) -> set[str]:
    """Series a Go metrics file declares: `<Subsystem or Namespace>: <constant>,` then `Name: "<name>"`."""
    declared = re.findall(
        r'(?:Subsystem|Namespace):\s*([\w.]+),\s*Name:\s*"(\w+)"', upstream(relative_path).read_text()
    )
    return {f"{prefix_of[owner]}_{name}" for owner, name in declared if owner in prefix_of}


def exporter_series() -> dict[str, set[str]]:
    """Series name prefix: the series its exporter's pinned source publishes."""
    return {
        "DCGM_FI_": dcgm_fields(),
        "kube_": kube_state_metrics_series(),
        "kueue_": go_metric_names("kueue/0.19.2/metrics.go", {"constants.KueueName": "kueue"}),
        "cluster_autoscaler_": go_metric_names(
            "cluster-autoscaler/cluster-autoscaler-1.36.1/metrics.go", {"caNamespace": "cluster_autoscaler"}
        ),
    }


def test_every_series_an_alert_reads_is_one_its_exporter_publishes():
    """A misspelt series is not an error to Prometheus: the alert just never fires. Every name the rules read
    must be one the pinned exporter source publishes (Kueue's subsystem is constants.KueueName, "kueue" in
    pkg/constants/constants.go at v0.19.2; the autoscaler's namespace is caNamespace in the same file)."""
    published = exporter_series()
    manifest = prometheus_rule_manifest(GpuAlertsSpec(), queued=True, autoscaled=True)
    rules = [rule for group in manifest["spec"]["groups"] for rule in group["rules"]]
    read = {name for rule in some(rules, at_least=7) for name in rule_metric_names(rule["expr"])}
    assert unpublished(some(read, at_least=10), published) == []


def unpublished(names: Iterable[str], published: dict[str, set[str]]) -> list[str]:
    """The series names no pinned exporter source publishes (a histogram's `_bucket` series by its base)."""
    missing = []
    for name in names:
        base = name.removesuffix("_bucket")
        owners = [prefix for prefix in published if base.startswith(prefix)]
        if len(owners) != 1 or base not in some(published[owners[0]]):
            missing.append(name)
    return sorted(missing)


def test_the_gpu_request_selector_matches_the_names_kube_state_metrics_gives_gpu_resources():
    """kube-state-metrics writes a resource name into the `resource` label through SanitizeLabelName
    (internal/store/utils.go, v2.20.0: each character outside [a-zA-Z0-9_] becomes `_`); the alerts' selector
    must match what that makes of whole GPUs, time-sliced slots and MIG slices."""
    source = upstream("kube-state-metrics/v2.20.0/utils.go").read_text()
    (pattern,) = re.findall(r"invalidLabelCharRE\s*=\s*regexp\.MustCompile\(`([^`]+)`\)", source)
    (selector,) = re.findall(r'resource=~"([^"]+)"', GPU_REQUESTS)
    for resource in ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb"):
        label = re.sub(pattern, "_", resource)
        assert re.fullmatch(selector, label), f"{resource} is reported as {label}, which {selector} misses"
    assert not re.fullmatch(selector, re.sub(pattern, "_", "amd.com/gpu"))


def test_the_plan_names_the_prometheus_volume_among_what_bills_unpriced(aws_k3s, aws_k3s_unmonitored):
    _, not_counted = idle_charges(aws_k3s)
    assert "1 x Prometheus volume (20Gi on the default StorageClass)" in not_counted
    _, not_counted = idle_charges(aws_k3s_unmonitored)
    assert not [item for item in not_counted if "Prometheus" in item]


@pytest.mark.parametrize("stack", ["aws_k3s", "gcp_gke"])
def test_turning_monitoring_and_inference_on_touches_no_node_and_deletes_nothing(request, stack):
    """The day-2 edit a user makes on a running stack (or the `up` after upgrading to a version that turns
    monitoring on by default): the second plan only adds (the charts, the rule, a
    firewall rule) and updates in place the releases that get scraped and the k3s policy's namespace list;
    no node, group, template, server or cluster changes."""
    base = request.getfixturevalue(f"{stack}_unmonitored")
    config = copy.deepcopy(request.getfixturevalue(f"{stack}_config"))
    config["gpu-k8s:cluster"]["inference"] = {}
    after = run_program(base.stack, config)
    before_inputs = {r.urn: r.inputs for r in base.registrations}
    after_inputs = {r.urn: r.inputs for r in after.registrations}
    assert set(before_inputs) <= set(after_inputs)  # nothing deleted (nor renamed, which would replace)
    changed = {urn.split("::")[-1] for urn in before_inputs if before_inputs[urn] != after_inputs[urn]}
    expected = {
        "aws_k3s": {
            "ml-gpu-operator-release",
            "ml-autoscaler-release",
            "ml-server-pods-policy",
        },
        "gcp_gke": {"ml-gpu-operator-release"},
    }[stack]
    assert changed == expected


@pytest.mark.parametrize("value", ["false", "off", 0, []])
def test_monitoring_is_a_mapping_or_true_or_false(aws_eks_config, value):
    """A quoted "false" is text, not false: the message says how to turn it off."""
    assert_refused_before_any_resource(
        aws_eks_config,
        set_path("monitoring", value),
        "gpu-k8s:cluster.monitoring",
        ["neither true/false nor a mapping", "`monitoring: false` (no quotes)"],
    )


def test_monitoring_true_empty_or_absent_is_the_defaults(aws_eks_config):
    from gpu_k8s.components.monitoring_spec import MonitoringSpec
    from gpu_k8s.components.spec import load_spec

    cluster = {k: v for k, v in aws_eks_config["gpu-k8s:cluster"].items() if k != "monitoring"}
    for given in ({}, {"monitoring": True}, {"monitoring": {}}, {"monitoring": None}):
        assert load_spec({**cluster, **given}).monitoring == MonitoringSpec(), given
    assert load_spec({**cluster, "monitoring": False}).monitoring is None
