"""`monitoring.dashboards`: the chart's Grafana, a dashboard of the GPU pools as a ConfigMap its sidecar
loads, and the recording rules that price the pools' nodes. Real consumers: promtool parses every panel's
query and evaluates the pool and cost queries over synthetic series; the series each query reads are held
to what their exporters' pinned sources publish (tests/test_monitoring.py)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import yaml

from gpu_k8s.components.monitoring import prometheus_rule_manifest, stack_values
from gpu_k8s.components.monitoring_dashboards import (
    DASHBOARD_LABEL,
    NODE_PRICE_SERIES,
    POOL_SERIES_LABEL,
    dashboard,
    pool_panels,
    price_rules,
)
from gpu_k8s.components.monitoring_spec import GpuAlertsSpec, MonitoringSpec
from gpu_k8s.tools.costs import node_price
from gpu_k8s.tools.engine import Recording, run_program
from gpu_k8s.tools.plan import redact
from tests.conftest import some, upstream
from tests.test_monitoring import (
    CHART_DIR,
    exporter_series,
    promtool,
    releases,
    rule_metric_names,
    rule_tests,
    traits,
    unpublished,
)

CONFIG_MAP = "kubernetes:core/v1:ConfigMap"


def planned_dashboard(recording: Recording) -> tuple[dict[str, Any], dict[str, Any]]:
    (board,) = [r for r in recording.by_type(CONFIG_MAP) if r.name.endswith("-monitoring-gpu-dashboard")]
    (content,) = board.inputs["data"].values()
    return board.inputs["metadata"], json.loads(content)


def test_the_dashboard_is_a_config_map_the_charts_grafana_loads(aws_eks, rendered):
    metadata, board = planned_dashboard(aws_eks)
    sidecar = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["grafana"]["sidecar"]["dashboards"]
    assert sidecar["enabled"]
    assert metadata["labels"] == {sidecar["label"]: sidecar["labelValue"]} == DASHBOARD_LABEL
    # As Helm renders the release: the dashboard sidecar watches ConfigMaps of `monitoring` only, where the
    # dashboard is, through a Role there; Grafana reads no Secret and nothing outside its namespace.
    objects = rendered["aws_eks", "kube-prometheus-stack"].objects
    (grafana,) = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-grafana")
    ]
    containers = {c["name"]: c for c in grafana["spec"]["template"]["spec"]["containers"]}
    env = {e["name"]: e.get("value") for e in containers["grafana-sc-dashboard"]["env"]}
    assert env["NAMESPACE"] == metadata["namespace"] == "monitoring" and env["RESOURCE"] == "configmap"
    assert not [o for o in objects if o["kind"] == "ClusterRole" and "grafana" in o["metadata"]["name"]]
    (role,) = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("-grafana")]
    assert role["metadata"]["namespace"] == "monitoring"
    (datasources,) = [o for o in objects if o["metadata"]["name"].endswith("-grafana-datasource")]
    assert "alertmanager" not in yaml.safe_dump(datasources["data"]).lower()
    values = releases(aws_eks)["kube-prometheus-stack"].inputs["values"]
    assert "enabled" not in values["grafana"]  # the chart's default: on
    assert values["kube-state-metrics"]["metricLabelsAllowlist"] == ["nodes=[gpu-k8s.io/pool]"]
    titles = [panel["title"] for panel in board["panels"]]
    assert "Cost of the running GPU nodes, USD per hour at list price, by pool" in titles
    assert "Jobs waiting, by queue" in titles  # aws-eks has `batch`
    assert len({panel["id"] for panel in board["panels"]}) == len(board["panels"])


def test_without_dashboards_neither_grafana_nor_the_dashboard_nor_the_prices(aws_eks_config):
    config = copy.deepcopy(aws_eks_config)
    config["gpu-k8s:cluster"]["monitoring"] = {"dashboards": False}
    recording = run_program("no-dashboards", config)
    values = releases(recording)["kube-prometheus-stack"].inputs["values"]
    assert values["grafana"] == {"enabled": False}
    assert "metricLabelsAllowlist" not in values["kube-state-metrics"]
    assert not [r for r in recording.by_type(CONFIG_MAP) if "dashboard" in r.name]
    (rule,) = [r for r in recording.registrations if r.name.endswith("-monitoring-gpu-alerts")]
    assert "gpu-k8s.prices" not in [group["name"] for group in rule.inputs["spec"]["groups"]]


def dashboard_prices(recording: Recording) -> dict[str, float]:
    (rule,) = [r for r in recording.registrations if r.name.endswith("-monitoring-gpu-alerts")]
    (prices,) = [group for group in rule.inputs["spec"]["groups"] if group["name"] == "gpu-k8s.prices"]
    assert {r["record"] for r in prices["rules"]} == {NODE_PRICE_SERIES}
    return {r["labels"][POOL_SERIES_LABEL]: float(r["expr"][len("vector(") : -1]) for r in prices["rules"]}


def test_each_pool_is_priced_as_the_plans_cost_table_prices_it(aws_eks, gcp_gke):
    """The same figure as `gpu-k8s plan` (tools/costs.py node_price), unrounded; on GCP too, an N1 pool with
    its attached GPUs."""
    pools = redact(aws_eks.outputs["gpuPools"])
    assert dashboard_prices(aws_eks) == {
        pool["name"]: node_price(aws_eks, pool).usd_per_hour for pool in some(pools, at_least=5)
    }
    pools = redact(gcp_gke.outputs["gpuPools"])
    assert [pool for pool in pools if pool["instanceType"].startswith("n1-")]
    expected = {pool["name"]: node_price(gcp_gke, pool) for pool in some(pools, at_least=2)}
    assert dashboard_prices(gcp_gke) == {
        name: p.usd_per_hour for name, p in expected.items() if p is not None
    }


def test_kube_state_metrics_names_the_pool_label_as_the_queries_do():
    """ "label_" + the node label with each character outside [a-zA-Z0-9_] as `_`, then snake case
    (kube-state-metrics v2.20.0 utils.go: labelName, SanitizeLabelName, toSnakeCase)."""
    source = upstream("kube-state-metrics/v2.20.0/utils.go").read_text()
    (invalid,) = re.findall(r"invalidLabelCharRE\s*=\s*regexp\.MustCompile\(`([^`]+)`\)", source)
    (capitals,) = re.findall(r'matchAllCap\s*=\s*regexp\.MustCompile\("([^"]+)"\)', source)
    assert 'return prefix + "_" + lintLabelName(SanitizeLabelName(labelName))' in source
    name = re.sub(capitals, r"\1_\2", re.sub(invalid, "_", "gpu-k8s.io/pool")).lower()
    assert f"label_{name}" == POOL_SERIES_LABEL


def test_every_panel_query_parses_and_reads_published_series(tmp_path: Path):
    """promtool parses each query (as a recording rule); the series they read are the exporters' or the
    price rules'."""
    panels = pool_panels(queued=True, autoscaled=True, priced=True)
    rules = [{"record": f"gpu_k8s:panel_{i}", "expr": expr} for i, (_, _, expr) in enumerate(panels)]
    result = promtool(tmp_path, "check rules", {"groups": [{"name": "panels", "rules": rules}]})
    assert result.returncode == 0, result.stdout + result.stderr
    read = {name for _, _, expr in some(panels, at_least=9) for name in rule_metric_names(expr)}
    # Names with a colon are recording rules': the price rules this toolkit records.
    assert {name for name in read if ":" in name} == {NODE_PRICE_SERIES}
    assert unpublished(some([n for n in read if ":" not in n], at_least=10), exporter_series()) == []


def sample(name: str, labels: dict[str, str], value: float) -> dict[str, str]:
    """An input series of promtool's unit tests: `value` at each of six evaluations."""
    selector = ",".join(f'{key}="{text}"' for key, text in labels.items())
    return {"series": f"{name}{{{selector}}}", "values": f"{value}x5"}


def test_the_pool_panels_compute_what_they_say(tmp_path: Path):
    """promtool test rules over series labelled as scraped: pool l4 has nodes a and b, two GPUs each (busy
    50/50 and 50/0 %, 10 of 40 GiB used on each), pool system node s; a pod holds 3 of a's 4 time-sliced
    slots (2 + 1 in two containers), another pod is pending; an l4 node costs 0.805 an hour.
    kube-state-metrics is rolling out: two of its pods report the node labels."""
    panels = {title: expr for title, _, expr in pool_panels(queued=False, autoscaled=False, priced=True)}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": price_rules({"l4": 0.805})}))
    ksm = {"job": "kube-state-metrics", "namespace": "monitoring", "service": "kube-state-metrics"}
    dcgm = {"job": "nvidia-dcgm-exporter", "namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x"}
    series = [
        sample("kube_node_labels", {**ksm, "pod": ksm_pod, "node": node, POOL_SERIES_LABEL: pool}, 1)
        for ksm_pod in ("ksm-old", "ksm-new")
        for node, pool in (("a", "l4"), ("b", "l4"), ("s", "system"))
    ]
    for node, gpu, busy in (("a", "0", 0.5), ("a", "1", 0.5), ("b", "0", 0.5), ("b", "1", 0.0)):
        labels = {**dcgm, "node": node, "gpu": gpu, "Hostname": node}
        series += [
            sample("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, busy),
            sample("DCGM_FI_DEV_FB_USED", labels, 10240),
            sample("DCGM_FI_DEV_FB_FREE", labels, 30720),
        ]
    gpus = {"resource": "nvidia_com_gpu", "unit": "integer"}
    series += [
        sample("kube_node_status_allocatable", {**ksm, "node": node, **gpus}, 4) for node in ("a", "b")
    ]
    for pod, container, node, count, phase in (
        ("train", "main", "a", 2, "Running"),
        ("train", "side", "a", 1, "Running"),
        ("wait", "main", "", 1, "Pending"),
    ):
        pod_labels = {**ksm, "namespace": "t", "pod": pod}
        series += [
            sample(
                "kube_pod_container_resource_requests",
                {**pod_labels, "container": container, "node": node, **gpus},
                count,
            ),
            sample("kube_pod_status_phase", {**pod_labels, "phase": phase}, 1),
        ]
    expected = {
        "GPU nodes running, by pool": 2,
        "GPU busy (graphics engine active), by pool": 0.375,
        "GPU memory used, by pool": 0.25,
        "GPU slots held by running pods, by pool": 3,
        "GPU slots the pools' nodes offer, by pool": 8,
        "Cost of the running GPU nodes, USD per hour at list price, by pool": 1.61,
    }
    tests = rule_tests(
        series,
        promql_expr_test=[
            {
                "expr": panels[title],
                "eval_time": "3m",
                "exp_samples": [{"labels": f'{{{POOL_SERIES_LABEL}="l4"}}', "value": value}],
            }
            for title, value in expected.items()
        ],
    )
    result = promtool(tmp_path, "test rules", tests)
    assert result.returncode == 0, result.stdout + result.stderr
    # The check can fail: a price the cost panel does not use is caught.
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": price_rules({"l4": 0.9})}))
    assert promtool(tmp_path, "test rules", tests).returncode != 0


def test_a_price_is_recorded_as_the_tables_have_it():
    (group,) = price_rules({"a100": 3.673385})
    assert group["rules"][0]["expr"] == "vector(3.673385)"


def test_the_dashboard_is_the_model_grafana_reads():
    board = dashboard(queued=True, autoscaled=False, priced=False)
    assert board["schemaVersion"] == 39 and board["uid"] == "gpu-k8s-gpu-pools"
    for panel in some(board["panels"], at_least=6):
        assert panel["type"] == "timeseries" and panel["gridPos"]["w"] == 12
        (target,) = panel["targets"]
        assert target["expr"] and panel["fieldConfig"]["defaults"]["unit"]
    assert not [p for p in board["panels"] if "Cost" in p["title"] or "autoscaler" in p["title"]]


def test_grafana_runs_on_the_system_nodes_with_its_values_in_the_chart():
    from gpu_k8s.components.spec import TaintSpec

    taint = TaintSpec(key="CriticalAddonsOnly", value="true", effect="NoExecute")
    values = stack_values(MonitoringSpec(), traits(system_taint=taint))
    assert values["grafana"]["tolerations"] == values["kube-state-metrics"]["tolerations"]
    grafana = yaml.safe_load((CHART_DIR / "charts" / "grafana" / "values.yaml").read_text())
    assert set(values["grafana"]) <= set(grafana)
    assert prometheus_rule_manifest(GpuAlertsSpec(), node_prices={"a": 1.0})["spec"]["groups"][-1] == {
        "name": "gpu-k8s.prices",
        "rules": [{"record": NODE_PRICE_SERIES, "expr": "vector(1.0)", "labels": {POOL_SERIES_LABEL: "a"}}],
    }


def test_the_stack_output_says_where_to_look_with_names_the_chart_renders(aws_eks, rendered):
    """`pulumi stack output monitoring`: port-forwards to the Services and the Secret the release renders."""
    access = aws_eks.outputs["monitoring"]
    objects = rendered["aws_eks", "kube-prometheus-stack"].objects
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    for command in (access["alerts"], access["grafana"]):
        (service, ports) = re.findall(r"port-forward svc/(\S+) (\S+),", command)[0]
        remote = int(ports.split(":")[-1])
        assert remote in {port["port"] for port in services[service]["spec"]["ports"]}, command
    (secret,) = re.findall(r"get secret (\S+) ", access["grafanaPassword"])
    assert "admin-password" in secrets[secret]["data"]
    assert access["dashboard"] == planned_dashboard(aws_eks)[1]["title"]
