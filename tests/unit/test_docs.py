"""The runbooks cover every alert: each rule's runbook_url names an anchor that exists."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_every_alert_links_to_an_existing_runbook_section() -> None:
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text(encoding="utf-8"))
    anchors = set(
        re.findall(r'<a id="([a-z0-9-]+)"></a>', (ROOT / "docs/runbooks.md").read_text(encoding="utf-8"))
    )
    linked = {
        rule["annotations"]["runbook_url"].split("#", 1)[1]
        for group in rules["groups"]
        for rule in group["rules"]
    }
    assert linked
    assert linked - anchors == set()
