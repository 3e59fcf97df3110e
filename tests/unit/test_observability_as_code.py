"""Alerts and the dashboard as code (deploy/): every spec alert exists, every PromQL expression parses,
and every metric it reads is one the code exports (src/pin_identity/observability/metrics.py, the single
source of truth).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import prometheus_client
import promql_parser
import pytest
import yaml  # type: ignore[import-untyped]
from prometheus_client.metrics import MetricWrapperBase

import pin_identity.observability.metrics as exported_metrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS_FILE = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD_FILE = ROOT / "deploy" / "grafana" / "identity-overview.json"

# One alert per row of the specs' "Наблюдаемость -> Alerts" (and the outbox alerts CONTRACTS 4a implies).
EXPECTED_ALERTS = [
    # access-fanout-job.ru.txt
    "AccessFanOutQueueBacklogHigh",  # queue_backlog > 100 for 5 min
    "AccessFanOutErrors",  # errors_total grows
    "AccessFanOutTaskFailed",  # Failed (poison) tasks appear
    "AccessEventsTopicBacklogHigh",  # pin.identity.access.v1 backlog > 1000
    "AccessFanOutNoSuccessfulRun",  # no successful run for > 5 min
    "AccessFanOutLagOverSLO",  # SLO: task lag p99 <= 5 min
    # talent-initial-import.ru.txt
    "TalentImportStuck",  # running = 1 without Done pages for > 10 min
    "TalentImportItemsQuarantined",  # identity_import_failed_items_total > 0
    "TalentImportRunOverSLO",  # run duration > 30 min
    "TalentPhoneConflictsGrowing",  # phone conflicts (R6) grow
    # CONTRACTS.md 4a: outbox
    "OutboxDeadLetters",
    "OutboxOldestEventTooOld",
]

# Metrics not exported by this service, read from a standard exporter. Keep this list minimal:
# kafka_consumergroup_lag (danielqsj/kafka-exporter) -- downstream consumers' lag on pin.identity.access.v1,
# which only the Kafka exporter sees (spec alert "backlog топика pin.identity.access.v1 > 1000").
EXTERNAL_METRICS = frozenset({"kafka_consumergroup_lag"})

# Labels Prometheus attaches to every scraped series, usable on any metric in addition to its own labels.
TARGET_LABELS = frozenset({"job", "instance"})

# Grafana's built-in interval variables, replaced by a duration before parsing.
GRAFANA_INTERVALS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "6h"}

CAMEL_CASE = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+$")
RUNBOOK_URL = re.compile(r"^docs/runbooks\.md#[a-z0-9]+(?:-[a-z0-9]+)*$")


def _exported_names() -> dict[str, frozenset[str]]:
    """Sample names the code exports, each with the label names it may carry."""
    labels_by_family: dict[str, frozenset[str]] = {}
    for value in vars(exported_metrics).values():
        if isinstance(value, MetricWrapperBase):
            labels_by_family[value._name] = frozenset(value._labelnames)
    names: dict[str, frozenset[str]] = {}
    for family in prometheus_client.REGISTRY.collect():
        own = labels_by_family.get(family.name, frozenset())
        # Labelled metrics with no child yet have no samples: derive the sample names from name and type.
        if family.type == "counter":  # prometheus_client strips `_total` from the family name
            names[family.name + "_total"] = own
        elif family.type == "histogram":
            names[family.name + "_bucket"] = own | {"le"}
            names[family.name + "_sum"] = own
            names[family.name + "_count"] = own
        elif family.type == "summary":
            names[family.name] = own | {"quantile"}
            names[family.name + "_sum"] = own
            names[family.name + "_count"] = own
        else:
            names[family.name] = own
        for sample in family.samples:
            names.setdefault(sample.name, frozenset(sample.labels))
    return names


EXPORTED = _exported_names()


def _load_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS_FILE.read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    rules: list[dict[str, Any]] = []
    for group in document["groups"]:
        assert group["name"] and group["rules"], group
        rules.extend(group["rules"])
    return rules


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a collapsed row keeps its panels inside


def _load_dashboard() -> dict[str, Any]:
    dashboard = json.loads(DASHBOARD_FILE.read_text(encoding="utf-8"))
    assert isinstance(dashboard, dict)
    return dashboard


def _dashboard_exprs() -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in _panels(_load_dashboard()["panels"])
        for target in panel.get("targets", [])
    ]


RULES = _load_rules()
DASHBOARD_EXPRS = _dashboard_exprs()


def _selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names matched) of every vector selector in the expression's AST."""
    found: list[tuple[str, set[str]]] = []

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            matchers = list(node.matchers.matchers)
            for alternative in node.matchers.or_matchers:
                matchers.extend(alternative)
            by_name = [
                m.value for m in matchers if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal
            ]
            names = {node.name} if node.name else set(by_name)
            assert len(names) == 1, f"selector without one literal metric name in {expr!r}: {node}"
            found.append((names.pop(), {m.name for m in matchers if m.name != "__name__"}))
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def _check_expr(expr: str) -> set[str]:
    """Parse; every metric is exported (or allow-listed) and matched only on its labels. Returns the names."""
    selectors = _selectors(expr)
    assert selectors, f"no metric referenced in {expr!r}"
    for name, labels in selectors:
        if name in EXTERNAL_METRICS:
            continue
        assert name in EXPORTED, (
            f"{name!r} (in {expr!r}) is not exported by pin_identity.observability.metrics"
        )
        unknown = labels - EXPORTED[name] - TARGET_LABELS
        assert not unknown, f"{name!r} has no label(s) {sorted(unknown)} (in {expr!r})"
    return {name for name, _ in selectors}


def test_the_exported_name_set_is_derived_from_the_registry() -> None:
    assert "identity_import_running" in EXPORTED  # gauge: as is
    assert "identity_import_failed_items_total" in EXPORTED  # counter: name + _total
    assert "identity_import_pages_total" in EXPORTED  # labelled counter without children
    assert EXPORTED["identity_import_pages_total"] == {"stage", "status"}
    assert {"identity_import_page_duration_ms_bucket", "identity_import_page_duration_ms_count"} <= set(
        EXPORTED
    )
    assert "identity_import_pages" not in EXPORTED
    assert "identity_import_running_total" not in EXPORTED
    assert not EXTERNAL_METRICS & set(EXPORTED)


def test_every_spec_alert_is_defined_once() -> None:
    names = [rule.get("alert") for rule in RULES]
    assert len(names) == len(set(names)), f"duplicate alert names: {names}"
    missing = [name for name in EXPECTED_ALERTS if name not in names]
    assert not missing, f"alerts missing from {ALERTS_FILE.name}: {missing}"


@pytest.mark.parametrize("rule", RULES, ids=[str(rule.get("alert")) for rule in RULES])
def test_an_alert_rule_is_complete(rule: dict[str, Any]) -> None:
    assert CAMEL_CASE.match(rule["alert"]), rule["alert"]
    assert isinstance(rule["expr"], str) and rule["expr"].strip()
    promql_parser.parse_duration(rule["for"])
    assert rule["labels"]["severity"] in {"warning", "critical"}
    annotations = rule["annotations"]
    assert annotations["summary"].strip() and annotations["description"].strip()
    assert RUNBOOK_URL.match(annotations["runbook_url"]), annotations["runbook_url"]


@pytest.mark.parametrize("rule", RULES, ids=[str(rule.get("alert")) for rule in RULES])
def test_an_alert_reads_only_exported_metrics(rule: dict[str, Any]) -> None:
    _check_expr(rule["expr"])


def test_the_dashboard_is_identity_overview_on_a_datasource_variable() -> None:
    dashboard = _load_dashboard()
    assert dashboard["uid"] == "identity-overview"
    assert dashboard["title"] == "identity-overview"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    rows = {panel["title"] for panel in _panels(dashboard["panels"]) if panel["type"] == "row"}
    assert {"Bootstrap (talent-initial-import)", "Access fan-out", "Outbox", "Talent sync"} <= rows
    for panel in _panels(dashboard["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"]) == panel["datasource"], panel["title"]


@pytest.mark.parametrize(("title", "expr"), DASHBOARD_EXPRS, ids=[title for title, _ in DASHBOARD_EXPRS])
def test_a_dashboard_query_reads_only_exported_metrics(title: str, expr: str) -> None:
    for variable, duration in GRAFANA_INTERVALS.items():
        expr = expr.replace(variable, duration)
    assert "$" not in expr, f"unknown Grafana variable in {title!r}: {expr!r}"
    _check_expr(expr)


def test_the_allow_list_holds_only_metrics_in_use() -> None:
    used: set[str] = set()
    for rule in RULES:
        used |= _check_expr(rule["expr"])
    assert set(EXTERNAL_METRICS) <= used, "drop unused entries from EXTERNAL_METRICS"


def test_a_misspelled_metric_fails_the_check() -> None:
    with pytest.raises(AssertionError, match="not exported"):
        _check_expr('identity_import_runing == 1 and on() identity_import_pages_total{status="Done"} > 0')
    with pytest.raises(AssertionError, match="no label"):
        _check_expr('increase(identity_import_pages_total{state="Done"}[10m]) > 0')
