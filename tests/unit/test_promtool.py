"""deploy/ under Prometheus's own checker, `promtool`: the alert rules' unit tests (alerts.test.yml) on the
rule file as an installation renders it, and `promtool check metrics` on this service's exposition.

promtool is a requirement of `make test` (it installs Debian's `prometheus` package); a missing binary fails
these tests rather than skipping them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from prometheus_client import REGISTRY

from pin_identity.observability import metrics
from tests.support.tools import installed_tool

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
RENDER = PROMETHEUS_DIR / "render-alerts.sh"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
BASE_URL = "https://git.example.com/pin/identity/-/blob/main/docs/runbooks.md"

# The spec fixes these names; promtool flags their abbreviated unit. Their `_seconds` twins are what deploy/
# reads. Nothing else may be flagged.
SPEC_MS_HISTOGRAMS = frozenset(
    {"identity_access_fanout_task_duration_ms", "identity_import_page_duration_ms"}
)


def _promtool() -> str:
    return installed_tool("promtool", "prometheus")


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=60, check=False)


def _render(source: Path, target: Path, base_url: str = BASE_URL) -> None:
    rendered = _run(str(RENDER), base_url, str(source))
    assert rendered.returncode == 0, rendered.stderr
    target.write_text(rendered.stdout, encoding="utf-8")


@pytest.fixture
def installed_rules(tmp_path: Path) -> Path:
    """alerts.yml and its tests rendered with a runbook base URL, side by side as promtool expects."""
    _render(PROMETHEUS_DIR / "alerts.yml", tmp_path / "alerts.yml")
    _render(PROMETHEUS_DIR / "alerts.test.yml", tmp_path / "alerts.test.yml")
    return tmp_path


def test_the_rendered_rules_pass_promtool_check_rules(installed_rules: Path) -> None:
    checked = _run(_promtool(), "check", "rules", str(installed_rules / "alerts.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 23 rules found" in checked.stdout


def test_every_alert_fires_and_stays_quiet_under_promtool_test_rules(installed_rules: Path) -> None:
    tested = _run(_promtool(), "test", "rules", str(installed_rules / "alerts.test.yml"))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def _alert_names() -> list[str]:
    document = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text(encoding="utf-8"))
    return [rule["alert"] for group in document["groups"] for rule in group["rules"]]


def _rule_tests() -> list[dict[str, Any]]:
    document = yaml.safe_load((PROMETHEUS_DIR / "alerts.test.yml").read_text(encoding="utf-8"))
    return [case for test in document["tests"] for case in test["alert_rule_test"]]


@pytest.mark.parametrize("alert", _alert_names())
def test_every_alert_has_a_firing_and_a_quiet_case(alert: str) -> None:
    cases = [case for case in _rule_tests() if case["alertname"] == alert]
    assert any(case.get("exp_alerts") for case in cases), f"{alert}: no case where it fires"
    assert any(not case.get("exp_alerts") for case in cases), f"{alert}: no case where it stays quiet"


def test_rendered_runbook_urls_are_absolute_and_reach_an_existing_section(installed_rules: Path) -> None:
    anchors = set(re.findall(r'<a id="([a-z0-9-]+)"></a>', RUNBOOKS.read_text(encoding="utf-8")))
    document = yaml.safe_load((installed_rules / "alerts.yml").read_text(encoding="utf-8"))
    urls = [rule["annotations"]["runbook_url"] for group in document["groups"] for rule in group["rules"]]
    assert len(urls) == 23
    for url in urls:
        base, _, anchor = url.partition("#")
        assert base == BASE_URL, url
        assert anchor in anchors, url


@pytest.mark.parametrize(
    "base_url", ["docs/runbooks.md", "", "https://docs.example.com/runbooks#x", 'https://a"b']
)
def test_render_refuses_a_base_url_that_would_not_be_clickable(base_url: str, tmp_path: Path) -> None:
    rendered = _run(str(RENDER), base_url)
    assert rendered.returncode == 2
    assert rendered.stderr.startswith("error: the runbook base URL must be an absolute http(s) URL")
    assert rendered.stdout == ""


# Every metric of metrics.py touched once, so that labelled families have a child and appear in the text.
_EXPOSITION = """
from prometheus_client import Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

import pin_identity.observability.metrics as metrics

for metric in vars(metrics).values():
    if not isinstance(metric, MetricWrapperBase):
        continue
    child = metric.labels(*["x"] * len(metric._labelnames)) if metric._labelnames else metric
    if isinstance(metric, Counter):
        child.inc()
    elif isinstance(metric, Gauge):
        child.set(1)
    elif isinstance(metric, Histogram):
        child.observe(1)
print(generate_latest().decode(), end="")
"""


def test_the_exposition_passes_promtool_check_metrics_but_for_the_specs_ms_names() -> None:
    # A process of its own: touching every metric must not change the counters other tests read.
    exposition = _run(sys.executable, "-c", _EXPOSITION)
    assert exposition.returncode == 0, exposition.stderr
    assert "identity_access_fanout_task_duration_seconds_bucket" in exposition.stdout
    checked = _run(_promtool(), "check", "metrics", stdin=exposition.stdout)
    findings = [line for line in (checked.stdout + checked.stderr).splitlines() if line.strip()]
    flagged = set()
    for finding in findings:
        name, _, problem = finding.partition(" ")
        family = name.removesuffix("_created")
        assert family in SPEC_MS_HISTOGRAMS and "abbreviated units" in problem, finding
        flagged.add(family)
    assert flagged == SPEC_MS_HISTOGRAMS, findings  # the check ran and saw both


def _sample(name: str) -> float:
    value = REGISTRY.get_sample_value(name)
    return 0.0 if value is None else value


def test_a_duration_is_observed_in_the_specs_milliseconds_and_in_seconds() -> None:
    pairs = [
        (metrics.observe_fanout_task_duration, "identity_access_fanout_task_duration"),
        (metrics.observe_import_page_duration, "identity_import_page_duration"),
    ]
    for observe, family in pairs:
        before_ms, before_s = _sample(f"{family}_ms_sum"), _sample(f"{family}_seconds_sum")
        observe(1.5)
        assert _sample(f"{family}_ms_sum") - before_ms == pytest.approx(1500)
        assert _sample(f"{family}_seconds_sum") - before_s == pytest.approx(1.5)
