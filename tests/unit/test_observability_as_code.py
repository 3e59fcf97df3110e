"""Alerts and the dashboard as code (deploy/): every spec alert exists, every PromQL expression parses,
and every metric it reads is one the code exports (src/pin_identity/observability/metrics.py, the single
source of truth). Environments stay apart: alerts aggregate by namespace, every dashboard selector filters on
the namespace and job variables. Every panel says what it shows, in one unit.
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
    "TalentSyncLagOverSLO",  # SLO: consumer lag after the handover < 5 min (in time, from record timestamps)
    # CONTRACTS.md 4a: outbox
    "OutboxDeadLetters",
    "OutboxOldestEventTooOld",
    "OutboxRelayBehind",  # the relay holds the fan-out back (the fan-out's lag alert names the relay then)
    # serve: the admin API's tokens file (a file that does not load)
    "AdminTokensFileNotLoaded",
    # a dead process reports nothing: each job's scrape targets (Prometheus's `up`)
    "AccessFanOutWorkerDown",
    "OutboxRelayDown",
    "TalentSyncDown",
    "TalentImportWorkerDown",
    "AdminApiDown",
]

# Metrics not exported by this service, read from a standard exporter. Keep this list minimal:
# kafka_consumergroup_lag (danielqsj/kafka-exporter) -- downstream consumers' lag on pin.identity.access.v1,
# which only the Kafka exporter sees (spec alert "backlog топика pin.identity.access.v1 > 1000").
EXTERNAL_METRICS = frozenset({"kafka_consumergroup_lag"})

# The series Prometheus writes for every scrape target itself: `up` (1 when the scrape succeeded), which a
# process that died cannot stop writing.
SCRAPE_METRICS = frozenset({"up"})

# Labels a scrape attaches to every series, usable on any metric in addition to its own labels
# (`namespace` comes from Kubernetes service discovery).
TARGET_LABELS = frozenset({"job", "instance", "namespace"})

# Grafana's built-in interval variables, replaced by a duration before parsing.
GRAFANA_INTERVALS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "6h"}

# The dashboard's own variables, each selector's filter: this service's metrics on one environment's jobs,
# the Kafka exporter's on the exporter job picked for that environment.
SCOPE_OF_OWN_METRICS = {"job": "$job", "namespace": "$namespace"}
SCOPE_OF_EXTERNAL_METRICS = {"job": "$kafka_job"}

CAMEL_CASE = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+$")
# The published address of docs/runbooks.md is filled in at install time (deploy/prometheus/render-alerts.sh).
RUNBOOK_URL = re.compile(r"^\$\{RUNBOOK_BASE_URL\}#[a-z0-9]+(?:-[a-z0-9]+)*$")


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
PANELS = [panel for panel in _panels(_load_dashboard()["panels"]) if panel["type"] != "row"]


def _nodes(expr: promql_parser.Expr) -> list[promql_parser.Expr]:
    found: list[promql_parser.Expr] = []

    def visit(node: promql_parser.Expr) -> bool:
        found.append(node)
        return True

    promql_parser.walk(expr, visit)
    return found


def _matchers(expr: str) -> list[tuple[str, dict[str, tuple[promql_parser.MatchOp, str]]]]:
    """(metric name, {label: (op, value)}) of every vector selector in the expression's AST."""
    found = []
    for node in _nodes(promql_parser.parse(expr)):
        if isinstance(node, promql_parser.VectorSelector):
            matchers = list(node.matchers.matchers)
            for alternative in node.matchers.or_matchers:
                matchers.extend(alternative)
            by_name = [
                m.value for m in matchers if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal
            ]
            names = {node.name} if node.name else set(by_name)
            assert len(names) == 1, f"selector without one literal metric name in {expr!r}: {node}"
            found.append((names.pop(), {m.name: (m.op, m.value) for m in matchers if m.name != "__name__"}))
    return found


def _selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names matched) of every vector selector in the expression's AST."""
    return [(name, set(matchers)) for name, matchers in _matchers(expr)]


def _with_intervals(expr: str) -> str:
    for variable, duration in GRAFANA_INTERVALS.items():
        expr = expr.replace(variable, duration)
    return expr


def _check_expr(expr: str) -> set[str]:
    """Parse; every metric is exported (or allow-listed) and matched only on its labels. Returns the names."""
    selectors = _selectors(expr)
    assert selectors, f"no metric referenced in {expr!r}"
    for name, labels in selectors:
        if name in EXTERNAL_METRICS or name in SCRAPE_METRICS:
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
    assert {  # the base-unit twins of the spec's _ms histograms
        "identity_import_page_duration_seconds_bucket",
        "identity_access_fanout_task_duration_seconds_bucket",
    } <= set(EXPORTED)
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


def _loses_namespace(node: promql_parser.Expr) -> bool:
    if isinstance(node, promql_parser.AggregateExpr):
        modifier = node.modifier
        if modifier is None:
            return True
        kept = modifier.type == promql_parser.AggModifierType.By
        return ("namespace" in modifier.labels) != kept
    if isinstance(node, promql_parser.BinaryExpr) and node.modifier and node.modifier.matching:
        matching = node.modifier.matching
        on = matching.type == promql_parser.LabelModifierType.Include
        return ("namespace" in matching.labels) != on
    return False


@pytest.mark.parametrize("rule", RULES, ids=[str(rule.get("alert")) for rule in RULES])
def test_an_alert_keeps_environments_apart(rule: dict[str, Any]) -> None:
    """Every aggregation and vector match keeps `namespace`: environments never add up or mask each other."""
    lost = [str(node) for node in _nodes(promql_parser.parse(rule["expr"])) if _loses_namespace(node)]
    assert not lost, f"{rule['alert']}: drops namespace in {lost}"


@pytest.mark.parametrize("rule", RULES, ids=[str(rule.get("alert")) for rule in RULES])
def test_an_alert_prints_values_for_people(rule: dict[str, Any]) -> None:
    """$value goes through humanize, humanizeDuration or printf: never "quarantined 1.0125 items"."""
    for name, text in rule["annotations"].items():
        for use in re.findall(r"\{\{[^}]*\$value[^}]*\}\}", text):
            assert re.search(r"\|\s*(humanize|humanizeDuration|printf)\b", use), f"{name}: {use}"


def test_an_alert_summing_environments_fails_the_check() -> None:
    assert _loses_namespace(promql_parser.parse("sum(increase(identity_outbox_dead_letters_total[15m]))"))
    assert _loses_namespace(promql_parser.parse("max by (le) (identity_outbox_backlog)"))
    assert _loses_namespace(promql_parser.parse("identity_outbox_backlog and on () identity_import_running"))
    assert not _loses_namespace(promql_parser.parse("max without (instance) (identity_outbox_backlog)"))


def test_the_dashboard_is_identity_overview_on_a_datasource_variable() -> None:
    dashboard = _load_dashboard()
    assert dashboard["uid"] == "identity-overview"
    assert dashboard["title"] == "identity-overview"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    rows = {panel["title"] for panel in _panels(dashboard["panels"]) if panel["type"] == "row"}
    assert {"Bootstrap (talent-initial-import)", "Access fan-out", "Outbox", "Talent sync"} <= rows
    # Not vacuous: the panels' own tests are parametrized by PANELS, and an empty list only skips them.
    assert PANELS, "no panel besides the rows"
    for panel in PANELS:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"]) == panel["datasource"], panel["title"]


@pytest.mark.parametrize(("title", "expr"), DASHBOARD_EXPRS, ids=[title for title, _ in DASHBOARD_EXPRS])
def test_a_dashboard_query_reads_only_exported_metrics(title: str, expr: str) -> None:
    expr = _with_intervals(expr)
    known = {*SCOPE_OF_OWN_METRICS.values(), *SCOPE_OF_EXTERNAL_METRICS.values()}
    unknown = set(re.findall(r"\$\w+", expr)) - known
    assert not unknown, f"unknown Grafana variable(s) {sorted(unknown)} in {title!r}: {expr!r}"
    _check_expr(expr)


@pytest.mark.parametrize(("title", "expr"), DASHBOARD_EXPRS, ids=[title for title, _ in DASHBOARD_EXPRS])
def test_a_dashboard_query_reads_one_environment(title: str, expr: str) -> None:
    for name, matchers in _matchers(_with_intervals(expr)):
        scope = SCOPE_OF_EXTERNAL_METRICS if name in EXTERNAL_METRICS else SCOPE_OF_OWN_METRICS
        for label, variable in scope.items():
            assert matchers.get(label) == (promql_parser.MatchOp.Re, variable), (
                f'{name} in {title!r} does not filter on {label}=~"{variable}": {expr!r}'
            )


def test_the_dashboard_variables_pick_one_environment() -> None:
    variables = {v["name"]: v for v in _load_dashboard()["templating"]["list"]}
    for name, label in (("namespace", "namespace"), ("job", "job"), ("kafka_job", "job")):
        variable = variables[name]
        assert variable["type"] == "query", name
        assert variable["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, name
        assert variable["description"].strip(), name
        found = re.fullmatch(rf"label_values\((.+), {label}\)", variable["query"])
        assert found, f"{name}: {variable['query']!r} is not label_values(<selector>, {label})"
        _check_expr(found.group(1).replace("$namespace", ".*"))
    # Environments never add up: one namespace at a time (jobs of that namespace may be several).
    assert variables["namespace"]["multi"] is False
    assert variables["namespace"]["includeAll"] is False


# A Grafana unit, and what it measures.
UNIT_DIMENSIONS = {
    "s": "time",
    "ms": "milliseconds",
    "ops": "rate",
    "short": "count",
    "none": "count",
    "percentunit": "share",
}
COMPARISONS = frozenset({"==", "!=", ">", "<", ">=", "<="})


def _dimension(node: promql_parser.Expr) -> str | None:
    """What an expression's values measure (a UNIT_DIMENSIONS value); None for a bare number."""
    if isinstance(node, promql_parser.NumberLiteral):
        return None
    if isinstance(node, promql_parser.ParenExpr | promql_parser.AggregateExpr):
        return _dimension(node.expr)
    if isinstance(node, promql_parser.MatrixSelector):
        return _dimension(node.vector_selector)
    if isinstance(node, promql_parser.VectorSelector):
        return _dimension_of_metric(str(node.name))
    if isinstance(node, promql_parser.Call):
        return _dimension_of_call(node)
    if isinstance(node, promql_parser.BinaryExpr):
        return _dimension_of_operation(node)
    raise AssertionError(f"no dimension rule for {node}")


def _dimension_of_metric(name: str) -> str:
    base = name.removesuffix("_bucket")
    if base.endswith("_seconds"):  # durations, ages and timestamps
        return "time"
    if base.endswith("_ms"):
        return "milliseconds"
    return "count"


def _dimension_of_call(call: promql_parser.Call) -> str | None:
    name = call.func.name
    if name == "time":
        return "time"
    if name in {"rate", "irate"}:
        return "rate"
    if name == "histogram_quantile":  # the unit of the observations, not of the bucket rates
        buckets = [n for n in _nodes(call.args[1]) if isinstance(n, promql_parser.VectorSelector)]
        return _dimension_of_metric(str(buckets[0].name))
    return _dimension(call.args[0])  # increase(), *_over_time(): the argument's unit


def _dimension_of_operation(operation: promql_parser.BinaryExpr) -> str | None:
    op = str(operation.op)
    lhs, rhs = _dimension(operation.lhs), _dimension(operation.rhs)
    if op in COMPARISONS and operation.modifier is not None and operation.modifier.return_bool:
        return "count"
    if op in COMPARISONS | {"and", "unless"}:  # a filter: the left side's values
        return lhs
    if op in {"+", "-", "or"}:
        assert lhs is None or rhs is None or lhs == rhs, f"{lhs} {op} {rhs}"
        return lhs or rhs
    if op == "/" and lhs == rhs == "count":  # a part of a whole
        return "share"
    raise AssertionError(f"no dimension rule for {op}")


@pytest.mark.parametrize("panel", PANELS, ids=[panel["title"] for panel in PANELS])
def test_a_panel_says_what_it_shows_and_in_which_unit(panel: dict[str, Any]) -> None:
    assert panel.get("description", "").strip(), f"{panel['title']!r} has no description"
    unit = panel["fieldConfig"]["defaults"].get("unit")
    assert unit in UNIT_DIMENSIONS, f"{panel['title']!r}: unit {unit!r} (one of {sorted(UNIT_DIMENSIONS)})"


@pytest.mark.parametrize("panel", PANELS, ids=[panel["title"] for panel in PANELS])
def test_a_panel_plots_one_unit(panel: dict[str, Any]) -> None:
    for override in panel["fieldConfig"].get("overrides", []):
        assert all(prop["id"] != "unit" for prop in override["properties"]), panel["title"]
    unit = panel["fieldConfig"]["defaults"]["unit"]
    for target in panel["targets"]:
        measured = _dimension(promql_parser.parse(_with_intervals(target["expr"])))
        assert measured == UNIT_DIMENSIONS[unit], (
            f"{panel['title']!r} ({unit}) plots {measured}: {target['expr']}"
        )


def test_a_panel_mixing_milliseconds_and_counts_fails_the_check() -> None:
    duration = (
        "histogram_quantile(0.99, sum by (le) (rate(identity_access_fanout_task_duration_ms_bucket[5m])))"
    )
    users = "histogram_quantile(0.99, sum by (le) (rate(identity_access_fanout_size_bucket[5m])))"
    assert _dimension(promql_parser.parse(duration)) == "milliseconds"
    assert _dimension(promql_parser.parse(users)) == "count"
    age = "time() - max(identity_access_fanout_last_success_timestamp_seconds > 0)"
    assert _dimension(promql_parser.parse(age)) == "time"


def test_the_allow_list_holds_only_metrics_in_use() -> None:
    used: set[str] = set()
    for rule in RULES:
        used |= _check_expr(rule["expr"])
    assert set(EXTERNAL_METRICS) <= used, "drop unused entries from EXTERNAL_METRICS"
    assert set(SCRAPE_METRICS) <= used, "drop unused entries from SCRAPE_METRICS"


def test_a_misspelled_metric_fails_the_check() -> None:
    with pytest.raises(AssertionError, match="not exported"):
        _check_expr('identity_import_runing == 1 and on() identity_import_pages_total{status="Done"} > 0')
    with pytest.raises(AssertionError, match="no label"):
        _check_expr('increase(identity_import_pages_total{state="Done"}[10m]) > 0')


def _row(title: str) -> list[dict[str, Any]]:
    """The panels of one row of the dashboard: those after its row panel, up to the next row."""
    panels, inside = [], False
    for panel in _load_dashboard()["panels"]:
        if panel["type"] == "row":
            inside = panel["title"] == title
            panels.extend(panel.get("panels", []) if inside else [])
        elif inside:
            panels.append(panel)
    return panels


def test_the_bootstrap_row_shows_the_runs_progress_against_its_planned_total() -> None:
    """The spec's dashboard: the bootstrap's progress by stage, as a share of what its source listed."""
    progress = [
        panel
        for panel in _row("Bootstrap (talent-initial-import)")
        for target in panel["targets"]
        if {"identity_import_run_items_finished", "identity_import_run_items_planned"}
        <= {name for name, _ in _selectors(_with_intervals(target["expr"]))}
    ]
    assert progress, "no Bootstrap panel divides the run's finished items by its planned ones"
    assert all(panel["fieldConfig"]["defaults"]["unit"] == "percentunit" for panel in progress)


INHIBIT_FILE = ROOT / "deploy" / "prometheus" / "alertmanager-inhibit-rules.yml"


def _inhibit_matchers(matchers: list[str]) -> dict[str, str]:
    pairs = [re.fullmatch(r'(\w+)(=~|=)"(.*)"', matcher) for matcher in matchers]
    assert all(pairs), matchers
    return {pair.group(1): pair.group(3) for pair in pairs if pair}


def test_the_inhibit_rule_silences_the_fan_outs_lag_only_while_an_outbox_alert_names_the_relay() -> None:
    """The fan-out's lag alert with cause waiting-for-relay is inhibited by the outbox's alerts, in the same
    namespace: the names and labels it matches are those alerts.yml gives."""
    [rule] = yaml.safe_load(INHIBIT_FILE.read_text(encoding="utf-8"))["inhibit_rules"]
    by_name = {r["alert"]: r for r in RULES}
    sources = _inhibit_matchers(rule["source_matchers"])
    target = _inhibit_matchers(rule["target_matchers"])
    for source in sources["alertname"].split("|"):
        assert by_name[source]["labels"]["job_name"] == "outbox-relay", source
    lag = by_name[target["alertname"]]
    assert target["cause"] in lag["expr"] and '"cause", "fan-out"' in lag["expr"]
    assert sources["service"] == target["service"] == lag["labels"]["service"]
    assert rule["equal"] == ["namespace"]
