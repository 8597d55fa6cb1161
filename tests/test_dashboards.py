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
from gpu_k8s.components.prices import aws_node_price
from gpu_k8s.tools.engine import Recording, run_program
from tests.conftest import some, upstream
from tests.test_monitoring import (
    CHART_DIR,
    exporter_series,
    promtool,
    releases,
    rule_metric_names,
    traits,
)

CONFIG_MAP = "kubernetes:core/v1:ConfigMap"


def planned_dashboard(recording: Recording) -> tuple[dict[str, Any], dict[str, Any]]:
    (board,) = [r for r in recording.by_type(CONFIG_MAP) if r.name.endswith("-monitoring-gpu-dashboard")]
    (content,) = board.inputs["data"].values()
    return board.inputs["metadata"], json.loads(content)


def test_the_dashboard_is_a_config_map_the_charts_grafana_loads(aws_eks):
    metadata, board = planned_dashboard(aws_eks)
    sidecar = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["grafana"]["sidecar"]["dashboards"]
    assert sidecar["enabled"] and sidecar["searchNamespace"] == "ALL"
    assert metadata["labels"] == {sidecar["label"]: sidecar["labelValue"]} == DASHBOARD_LABEL
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


def test_each_pool_is_priced_as_the_plan_prices_it(aws_eks, aws_eks_config):
    (rule,) = [r for r in aws_eks.registrations if r.name.endswith("-monitoring-gpu-alerts")]
    (prices,) = [group for group in rule.inputs["spec"]["groups"] if group["name"] == "gpu-k8s.prices"]
    priced = {r["labels"][POOL_SERIES_LABEL]: r["expr"] for r in prices["rules"]}
    pools = aws_eks_config["gpu-k8s:cluster"]["gpuPools"]
    for pool in some(pools, at_least=3):
        price = aws_node_price(pool["instanceType"], "us-east-1", pool.get("spot", False))
        assert price is not None
        assert priced[pool["name"]] == f"vector({price.usd_per_hour:g})"
    assert {r["record"] for r in prices["rules"]} == {NODE_PRICE_SERIES}


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
    published = exporter_series()
    read = {name for _, _, expr in some(panels, at_least=9) for name in rule_metric_names(expr)}
    for name in some(read, at_least=10):
        base = re.sub(r"_bucket$", "", name)
        if ":" in name:
            assert name == NODE_PRICE_SERIES
            continue
        owners = [prefix for prefix in published if base.startswith(prefix)]
        assert len(owners) == 1, f"{name}: no pinned exporter source says it publishes this series"
        assert base in published[owners[0]], f"{name} is not among the series {owners[0]}* publishes"


def test_the_pool_and_cost_panels_compute_what_they_say(tmp_path: Path):
    """promtool test rules: two nodes of pool l4 (one GPU each, one busy 60%, one 20%), one system node; a
    node of l4 costs 0.805 an hour."""
    panels = {title: expr for title, _, expr in pool_panels(queued=False, autoscaled=False, priced=True)}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": price_rules({"l4": 0.805})}))
    series = [
        {"series": f'kube_node_labels{{node="{node}",{POOL_SERIES_LABEL}="{pool}"}}', "values": "1x5"}
        for node, pool in (("a", "l4"), ("b", "l4"), ("s", "system"))
    ]
    series += [
        {"series": f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{node="{node}",gpu="0"}}', "values": f"{busy}x5"}
        for node, busy in (("a", 0.6), ("b", 0.2))
    ]
    expected = {
        "GPU nodes running, by pool": 2,
        "GPU busy (graphics engine active), by pool": 0.4,
        "Cost of the running GPU nodes, USD per hour at list price, by pool": 1.61,
    }
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": panels[title],
                        "eval_time": "3m",
                        "exp_samples": [{"labels": f'{{{POOL_SERIES_LABEL}="l4"}}', "value": value}],
                    }
                    for title, value in expected.items()
                ],
            }
        ],
    }
    result = promtool(tmp_path, "test rules", tests)
    assert result.returncode == 0, result.stdout + result.stderr
    # The check can fail: a price the cost panel does not use is caught.
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": price_rules({"l4": 0.9})}))
    assert promtool(tmp_path, "test rules", tests).returncode != 0


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
        "rules": [{"record": NODE_PRICE_SERIES, "expr": "vector(1)", "labels": {POOL_SERIES_LABEL: "a"}}],
    }
