"""An alert rule of deploy/prometheus/alerts.yml judged by promtool on series a test measured: the figures a
process exports, turned into the series Prometheus would have scraped, and whether the rule fires on them."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

import yaml  # type: ignore[import-untyped]

from tests.support.tools import installed_tool

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"


def firing_after(
    alert: str, series: Mapping[str, str], at: str, workdir: Path, *, namespace: str = "prod"
) -> subprocess.CompletedProcess[str]:
    """promtool's verdict on "`alert` fires for `namespace` at `at`" over `series` (promtool's notation:
    `'metric{labels}': 'values'`). Judged on the ALERTS series, so the annotations do not need predicting."""
    rule = next(
        r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if r["alert"] == alert
    )
    labels = {"alertname": alert, "alertstate": "firing", **rule["labels"], "namespace": namespace}
    document = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": name, "values": values} for name, values in series.items()],
                "promql_expr_test": [
                    {
                        "expr": f'ALERTS{{alertname="{alert}", alertstate="firing"}}',
                        "eval_time": at,
                        "exp_samples": [
                            {
                                "labels": "ALERTS{"
                                + ", ".join(f'{k}="{v}"' for k, v in labels.items())
                                + "}",
                                "value": 1,
                            }
                        ],
                    }
                ],
            }
        ],
    }
    tests = workdir / f"{alert}.test.yml"
    tests.write_text(yaml.safe_dump(document), encoding="utf-8")
    return subprocess.run(
        [installed_tool("promtool", "prometheus"), "test", "rules", str(tests)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
