"""deploy/container and deploy/kubernetes: the linters from PyPI, and what the manifests must keep true.

The linters (hadolint, kubernetes-validate, checkov) come from `make deploy-tools`, part of `make test`,
into .venv/deploy-lint; a missing one fails these tests rather than skipping them. They run offline: checkov
with --skip-download and its update check off, kubernetes-validate on the schemas inside its package.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from pin_identity.composition.privileges import DATABASE_JOBS, KAFKA_JOBS
from pin_identity.config import ENV_PREFIX, Settings
from pin_identity.entrypoints.worker import ALL_JOBS

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "container" / "Dockerfile"
KUBERNETES = ROOT / "deploy" / "kubernetes"
JOBS = ("db-upgrade", "ensure-topics", "bootstrap")
KUSTOMIZATIONS = (KUBERNETES, *(KUBERNETES / "jobs" / job for job in JOBS))
# Its configuration table names every variable (CONTRACTS section 1 and ours).
README = ROOT / "docs" / "operators.md"
LINT_BIN = ROOT / ".venv" / "deploy-lint" / "bin"

# The oldest Kubernetes the manifests are for (PodDisruptionBudget's unhealthyPodEvictionPolicy is GA in
# 1.31) and the newest the validator knows.
KUBERNETES_VERSIONS = ("1.31.0", "1.37.0")
# Prometheus Operator kinds: the validator has no schema for them (it says WARN and passes them).
CUSTOM_KINDS = frozenset({"PodMonitor", "PrometheusRule"})
# The secrets the manifests reference and deploy/README.md tells how to create; none is in the repository.
SHARED_SECRETS = frozenset({"pin-identity-kafka", "pin-identity-talent", "pin-identity-admin-tokens"})
# One database login per role of the grant table, the schema owner's for the db-upgrade Job.
DATABASE_LOGINS = {f"pin-identity-database-{job}": job for job in DATABASE_JOBS}
# One Kafka login per principal of the ACL table that runs in a pod (access-reader's is an operator's, for
# `access audit` and `access show`), and one for access-fanout, which only logs in (/readyz).
IN_PODS = [job for job in KAFKA_JOBS if job != "access-reader"]
KAFKA_LOGINS = {f"pin-identity-kafka-{job}": job for job in (*IN_PODS, "access-fanout")}
SECRETS = SHARED_SECRETS | set(KAFKA_LOGINS) | set(DATABASE_LOGINS)
# Each checkov finding left as it is, with its reason in the skip annotation beside it (deploy/README.md).
JUSTIFIED_SKIPS = frozenset({"CKV_DOCKER_2", "CKV_K8S_11", "CKV_K8S_15", "CKV_K8S_35", "CKV_K8S_43"})


def _tool(name: str) -> str:
    path = LINT_BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    assert found, f"{name} is missing: `make deploy-tools` installs it (deploy/lint-requirements.txt)"
    return found


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=180, check=False, env=env, cwd=ROOT)


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def _manifest_files() -> list[Path]:
    return sorted(p for p in KUBERNETES.rglob("*.yaml") if p.name != "kustomization.yaml")


@functools.cache
def _parsed() -> tuple[dict[str, Any], ...]:
    return tuple(doc for path in _manifest_files() for doc in _documents(path))


def _resources() -> list[dict[str, Any]]:
    """Every resource, parsed once: the tests only read them."""
    return list(_parsed())


def _of_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for doc in _resources() if doc["kind"] == kind]


def _pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in _of_kind("Deployment") + _of_kind("Job"):
        yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """A pod's containers in the order they run: its init containers first."""
    return [*spec.get("initContainers", []), *spec["containers"]]


def _package_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"])


def _image_uid() -> int:
    found = re.search(r"^USER (\d+):(\d+)$", DOCKERFILE.read_text(encoding="utf-8"), re.M)
    assert found, "the Dockerfile's USER must be numeric uid:gid"
    return int(found.group(1))


# ---------------------------------------------------------------- the linters


def test_the_dockerfile_passes_hadolint_which_flags_a_bad_one(tmp_path: Path) -> None:
    hadolint = _tool("hadolint")
    linted = _run(hadolint, str(DOCKERFILE))
    print(f"$ hadolint {DOCKERFILE.relative_to(ROOT)}  (exit {linted.returncode})\n{linted.stdout}")
    assert linted.returncode == 0, linted.stdout + linted.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\n", encoding="utf-8")
    flagged = _run(hadolint, str(bad))
    assert flagged.returncode != 0
    assert {"DL3007", "DL3008"} <= set(re.findall(r"DL\d{4}", flagged.stdout)), flagged.stdout


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_api_schemas(version: str) -> None:
    files = [str(p.relative_to(ROOT)) for p in _manifest_files()]
    validated = _run(_tool("kubernetes-validate"), "--strict", "-k", version, *files)
    print(
        f"$ kubernetes-validate --strict -k {version} ...  (exit {validated.returncode})\n{validated.stdout}"
    )
    assert validated.returncode == 0, validated.stdout + validated.stderr
    passed = re.findall(r"^INFO \S+ passed for resource (\S+) against", validated.stdout, re.M)
    unchecked = set(re.findall(r"^WARN \S+ Couldn't find schema for kind (\S+) ", validated.stdout, re.M))
    assert unchecked == CUSTOM_KINDS, "only the Prometheus Operator's kinds may go unvalidated"
    expected = [doc for doc in _resources() if doc["kind"] not in CUSTOM_KINDS]
    assert len(passed) == len(expected)


def test_checkov_finds_nothing_but_the_justified_skips_and_flags_a_bad_pod(tmp_path: Path) -> None:
    bad = tmp_path / "bad-pod.yaml"
    bad.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: bad, namespace: x}\n"
        "spec: {containers: [{name: c, image: 'busybox:1.36'}]}\n",
        encoding="utf-8",
    )
    env = {**os.environ, "CKV_SKIP_PACKAGE_UPDATE_CHECK": "true", "BC_SKIP_MAPPING": "TRUE"}
    checkov = _tool("checkov")
    args = ["--skip-download", "--framework", "dockerfile", "kubernetes", "--output", "json", "--compact"]
    # Files, not --directory: with a directory checkov ignores every --file beside it.
    files = [DOCKERFILE, *_manifest_files(), bad]
    scanned = _run(checkov, *args, *(f"--file={path}" for path in files), env=env)
    assert scanned.stdout.startswith(("[", "{")), (
        f"checkov did not report (exit {scanned.returncode}): {scanned.stderr}"
    )
    reports = json.loads(scanned.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [c for r in reports for c in r["results"]["failed_checks"]]
    ours = [
        f"{c['check_id']} {c['file_path']} {c['resource']}" for c in failed if "bad-pod" not in c["file_path"]
    ]
    assert ours == [], "\n".join(ours)
    flagged = {c["check_id"] for c in failed}
    assert {"CKV_K8S_20", "CKV_K8S_22", "CKV_K8S_28"} <= flagged, "checkov must flag an unconfined pod"
    skipped = [c for r in reports for c in r["results"]["skipped_checks"]]
    assert {c["check_id"] for c in skipped} == JUSTIFIED_SKIPS
    for check in skipped:
        assert len(check["check_result"]["suppress_comment"].split()) >= 5, (
            f"{check['check_id']}: say why it is skipped"
        )
    for report in reports:
        print(f"checkov {report['check_type']}: {report['summary']}")


# ---------------------------------------------------------------- what the manifests keep true


def test_the_prometheus_rule_is_generated_from_the_alert_rules() -> None:
    generated = _run(str(KUBERNETES / "generate-prometheusrule.sh"))
    assert generated.returncode == 0, generated.stderr
    assert generated.stdout == (KUBERNETES / "prometheusrule.yaml").read_text(encoding="utf-8"), (
        "deploy/kubernetes/prometheusrule.yaml is stale: run deploy/kubernetes/generate-prometheusrule.sh"
    )
    (rule,) = _of_kind("PrometheusRule")
    assert rule["spec"] == yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())


def test_the_kustomizations_cover_every_manifest_once_with_one_namespace_and_image() -> None:
    base = KUBERNETES / "base"
    listed: list[Path] = []
    for directory in KUSTOMIZATIONS:
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
        assert kustomization["namespace"] == "pin-identity"
        image = {"name": "pin-identity", "newName": "registry.example.com/pin-identity"}
        assert kustomization["images"] == [{**image, "newTag": _package_version()}]
        for entry in kustomization["resources"]:
            target = (directory / entry).resolve()
            assert target.is_file() or target == base, f"{directory}: {entry} is no manifest"
            listed += [target] if target.is_file() else []
    shared = yaml.safe_load((base / "kustomization.yaml").read_text(encoding="utf-8"))["resources"]
    listed += [base / entry for entry in shared]
    assert sorted(listed) == _manifest_files(), "every manifest in exactly one kustomization"
    assert {doc["metadata"]["namespace"] for doc in _resources()} == {"pin-identity"}


def test_one_deployment_per_job_and_the_relay_with_a_standby() -> None:
    commands = {
        doc["metadata"]["name"]: doc["spec"]["template"]["spec"]["containers"][0]["args"]
        for doc in _of_kind("Deployment")
    }
    jobs = sorted(args[2] for args in commands.values() if args[:2] == ["worker", "--jobs"])
    assert jobs == sorted(ALL_JOBS)
    assert [args[0] for args in commands.values()].count("serve") == 1
    relay = next(d for d in _of_kind("Deployment") if d["metadata"]["name"] == "pin-identity-outbox-relay")
    assert relay["spec"]["replicas"] >= 2, "one active relay and a standby"
    jobs_run = sorted(
        " ".join(_containers(doc["spec"]["template"]["spec"])[0]["args"]) for doc in _of_kind("Job")
    )
    assert jobs_run == ["db upgrade", "kafka ensure-topics", "talent-import run --mode api-pull --json"]


def test_every_deployment_has_a_disruption_budget_and_serve_a_service() -> None:
    budgets = [doc["spec"]["selector"]["matchLabels"] for doc in _of_kind("PodDisruptionBudget")]
    for deployment in _of_kind("Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert [b for b in budgets if b.items() <= labels.items()], deployment["metadata"]["name"]
    (service,) = _of_kind("Service")
    serve = next(d for d in _of_kind("Deployment") if d["metadata"]["name"] == "pin-identity-serve")
    container = serve["spec"]["template"]["spec"]["containers"][0]
    assert service["spec"]["selector"].items() <= serve["spec"]["template"]["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in container["ports"]}


@pytest.mark.parametrize("name", [d["metadata"]["name"] for d in _of_kind("Deployment")])
def test_probes_ask_the_endpoints_that_exist_on_the_port_the_process_listens_on(name: str) -> None:
    deployment = next(d for d in _of_kind("Deployment") if d["metadata"]["name"] == name)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    if container["args"][0] == "serve":
        listening = int(container["args"][container["args"].index("--port") + 1])
    else:
        listening = int(_configmap("pin-identity")["PIN_IDENTITY_WORKER_HTTP_PORT"])
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = container[kind]["httpGet"]
        assert probe["path"] in {"/healthz", "/readyz"}
        assert ports[probe["port"]] == listening, f"{kind} asks port {probe['port']}"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def _configmap(name: str) -> dict[str, str]:
    return next(doc["data"] for doc in _of_kind("ConfigMap") if doc["metadata"]["name"] == name)


@pytest.mark.parametrize("name", [name for name, _ in _pod_specs()])
def test_every_pod_runs_locked_down_from_this_image(name: str) -> None:
    spec = dict(_pod_specs())[name]
    assert spec["serviceAccountName"] == "pin-identity"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] == pod["runAsGroup"] == _image_uid()
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in _containers(spec):
        assert container["image"] == f"pin-identity:{_package_version()}"
        assert container["securityContext"] == {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        resources = container["resources"]
        assert set(resources["requests"]) == {"cpu", "memory"}
        assert set(resources["limits"]) == {"memory"}


def test_secrets_are_referenced_never_included_and_every_variable_is_a_setting() -> None:
    assert _of_kind("Secret") == []
    known = {ENV_PREFIX + field.upper() for field in Settings.model_fields}
    known |= set(re.findall(r"^\| `(PIN_IDENTITY_[A-Z_]+)`", README.read_text(encoding="utf-8"), re.M))
    referenced: set[str] = set()
    for name, spec in _pod_specs():
        for container in _containers(spec):
            for variable in container["env"]:
                assert variable["name"] in known, f"{name}: {variable['name']} is no setting"
                if "valueFrom" in variable:
                    referenced.add(variable["valueFrom"]["secretKeyRef"]["name"])
        referenced |= {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
    assert referenced == SECRETS
    assert set(_configmap("pin-identity")) <= known
    readme = (ROOT / "deploy" / "README.md").read_text(encoding="utf-8")
    told = all(f"`{secret}`" in readme for secret in SHARED_SECRETS)
    assert told, "deploy/README.md tells how to create each"
    assert "`pin-identity-kafka-<job>`" in readme and "`pin-identity-database-<job>`" in readme


def test_each_pod_that_reaches_kafka_logs_in_as_its_own_jobs_principal_from_files() -> None:
    mounted: set[str] = set()
    for name, spec in _pod_specs():
        (container,) = spec["containers"]
        variables = {variable["name"]: variable for variable in container["env"]}
        if "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS" not in variables:
            continue
        assert "PIN_IDENTITY_KAFKA_CONFIG" not in variables, f"{name}: a login in a variable"
        config = Path(variables["PIN_IDENTITY_KAFKA_CONFIG_FILE"]["value"])
        (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == config.parent]
        (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        component = name.removeprefix("pin-identity-").replace("bootstrap", "talent-import")
        job = "topic-admin" if component == "ensure-topics" else component
        assert KAFKA_LOGINS[volume["secret"]["secretName"]] == job, name
        assert volume["secret"]["defaultMode"] == 0o440 and spec["securityContext"]["fsGroup"] == 10001
        mounted.add(volume["secret"]["secretName"])
    # Each login was checked on a pod: were the variable looked for renamed, every pod would be skipped.
    assert mounted == set(KAFKA_LOGINS)


def test_each_pod_connects_to_the_database_as_its_own_jobs_role_with_the_password_from_a_file() -> None:
    logged_in: set[str] = set()
    for name, spec in _pod_specs():
        for container in _containers(spec):
            variables = {variable["name"]: variable for variable in container["env"]}
            if "PIN_IDENTITY_DATABASE_URL" not in variables:
                continue
            login = variables["PIN_IDENTITY_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"]
            component = name.removeprefix("pin-identity-").replace("bootstrap", "talent-import")
            assert DATABASE_LOGINS[login] == ("migrations" if component == "db-upgrade" else component), name
            password = Path(variables["PIN_IDENTITY_DATABASE_PASSWORD_FILE"]["value"])
            (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == password.parent]
            (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
            assert volume["secret"]["secretName"] == login, name
            assert volume["secret"]["items"] == [{"key": "password", "path": password.name}], name
            assert volume["secret"]["defaultMode"] == 0o440 and spec["securityContext"]["fsGroup"] == 10001
            logged_in.add(login)
    assert logged_in == set(DATABASE_LOGINS)  # each checked on a pod, none skipped for a renamed variable


def test_the_schema_owners_job_applies_the_grants_after_the_migrations() -> None:
    (spec,) = [spec for name, spec in _pod_specs() if name == "pin-identity-db-upgrade"]
    steps = [container["args"] for container in _containers(spec)]
    assert steps == [["db", "upgrade"], ["db", "grants", "--apply"]]


def test_the_tokens_file_is_the_whole_secret_mounted_so_that_edits_reach_it() -> None:
    (spec,) = [spec for name, spec in _pod_specs() if name == "pin-identity-serve"]
    (container,) = spec["containers"]
    path = Path(next(v["value"] for v in container["env"] if v["name"] == "PIN_IDENTITY_ADMIN_TOKENS_FILE"))
    (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    assert "subPath" not in mount, "a subPath mount never sees the Secret's updates"
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "pin-identity-admin-tokens"
    assert "`tokens`" in (ROOT / "deploy" / "README.md").read_text(
        encoding="utf-8"
    )  # the key is the file name
    assert path.name == "tokens"
