"""The deployment files: the systemd unit, the Kubernetes manifests and the
Dockerfile, checked offline against the tools and schemas that judge them, and
against pgfence's own settings and command line, so that a renamed setting or
a drifted value breaks a test instead of a deployment.

- systemd: ``systemd-analyze verify`` on the unit, plus its key values;
- Kubernetes: the bundled JSON schemas of ``kubernetes-validate`` (strict:
  an unknown field fails) for the core kinds, hand-written checks for the
  CRDs (PodMonitor, ScaledObject), and the cross-references between files;
  KEDA's query runs on a real database;
- Docker: the Dockerfile's instructions, and its HEALTHCHECK command run
  against a local HTTP server.
"""

from __future__ import annotations

import http.server
import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest
import yaml

from pgtools import finish
from pgfence import enqueue
from pgfence.cli import main as cli
from pgfence import settings as settings_mod

ROOT = Path(__file__).resolve().parent.parent
SYSTEMD = ROOT / "deploy" / "systemd"
K8S = ROOT / "deploy" / "kubernetes"
UNIT = SYSTEMD / "pgfence.service"
ENV_EXAMPLE = SYSTEMD / "pgfence.env.example"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
LICENSE = ROOT / "LICENSE"
GRAFANA_DATASOURCES = ROOT / "grafana" / "provisioning" / "datasources" / "prometheus.yaml"

INSTALLED_PGFENCE = "/opt/pgfence/bin/pgfence"
METRICS_PORT = 9464
POD_LABELS = {"app.kubernetes.io/name": "pgfence", "app.kubernetes.io/component": "worker"}
# Kubernetes versions whose schemas the core manifests must satisfy: an old
# one still in use, and the newest the package bundles.
K8S_VERSIONS = ["1.28.0", "latest"]


# -- helpers ----------------------------------------------------------------------


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit as {section: {key: [values in order]}} (keys repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"key outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(unit: dict, section: str, key: str) -> str:
    values = unit[section].get(key)
    assert values is not None, f"{key}= missing from [{section}]"
    assert len(values) == 1, f"{key}= given {len(values)} times in [{section}]"
    return values[0]


def parse_env_file(path: Path) -> dict[str, str]:
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), f"not KEY=value: {line!r}"
        assert key not in out, f"{key} given twice"
        out[key] = value
    return out


def systemd_analyze_verify(unit_text: str, tmp_path: Path) -> tuple[int, list[str]]:
    """Run ``systemd-analyze verify`` on ``unit_text`` as pgfence.service, with
    the installed binary swapped for one that exists here (verify checks that
    ExecStart's binary is executable).  Returns the exit code and the output
    lines that concern the unit."""
    exe = shutil.which("pgfence") or str(Path(sys.executable).parent / "pgfence")
    assert Path(exe).is_file(), "the pgfence console script is not installed next to this Python"
    path = tmp_path / "pgfence.service"
    path.write_text(unit_text.replace(INSTALLED_PGFENCE, exe))
    proc = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)
    lines = (proc.stdout + proc.stderr).splitlines()
    return proc.returncode, [ln for ln in lines if "pgfence.service" in ln]


def load_yaml(name: str) -> dict:
    docs = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d is not None]
    assert len(docs) == 1, f"{name}: expected one document, got {len(docs)}"
    return docs[0]


def k8s_validate(doc: dict, version: str) -> None:
    import kubernetes_validate

    if version == "latest":
        version = kubernetes_validate.latest_version()
    kubernetes_validate.validate(doc, version, strict=True)


def container(deployment: dict, name: str) -> dict:
    [c] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


def plain_env(c: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, line continuations joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        instruction, _, args = line.partition(" ")
        out.append((instruction.upper(), args.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return out


def final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [i for i, (ins, _) in enumerate(instructions) if ins == "FROM"]
    return instructions[starts[-1]:]


def dockerfile_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for ins, args in stage:
        if ins == "ENV":
            for pair in shlex.split(args):
                key, sep, value = pair.partition("=")
                assert sep, f"ENV in the legacy 'ENV key value' form: {args!r}"
                env[key] = value
    return env


# -- systemd ------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    rc, complaints = systemd_analyze_verify(UNIT.read_text(), tmp_path)
    assert complaints == [], "\n".join(complaints)
    assert rc == 0


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_check_catches_unknown_and_invalid_keys(tmp_path):
    # The check above would notice: systemd-analyze exits 0 on an unknown key,
    # so the output is what must be read.
    text = UNIT.read_text().replace("[Service]\n", "[Service]\nKillMod=mixed\nProtectSystem=strictest\n", 1)
    _rc, complaints = systemd_analyze_verify(text, tmp_path)
    assert any("KillMod" in ln for ln in complaints), complaints
    assert any("strictest" in ln or "protect system" in ln.lower() for ln in complaints), complaints


def test_systemd_unit_values():
    unit = parse_unit(UNIT.read_text())
    assert set(unit) == {"Unit", "Service", "Install"}
    s = "Service"
    assert one(unit, s, "Type") == "notify"
    assert one(unit, s, "NotifyAccess") == "main"
    assert one(unit, s, "ExecStart") == f"{INSTALLED_PGFENCE} run"
    assert one(unit, s, "ExecStartPre") == f"{INSTALLED_PGFENCE} migrate"
    assert one(unit, s, "ExecReload") == "/bin/kill -HUP $MAINPID"
    assert one(unit, s, "KillMode") == "mixed"
    assert one(unit, s, "KillSignal") == "SIGTERM"
    assert one(unit, s, "Restart") == "on-failure"
    assert one(unit, s, "RestartSec") == "5"
    assert one(unit, s, "WatchdogSec") == "30"
    assert one(unit, s, "OOMPolicy") == "continue"     # a worker's OOM kill is the arbiter's business
    assert one(unit, s, "EnvironmentFile") == "/etc/pgfence/pgfence.env"   # required: no "-" prefix
    assert one(unit, s, "RuntimeDirectory") == "pgfence"
    assert "PGFENCE_METRICS_DIR=%t/pgfence/metrics" in unit[s]["Environment"]
    # The drain must fit in the stop timeout, with room for releasing the
    # jobs still running at its end.
    stop = int(one(unit, s, "TimeoutStopSec"))
    assert stop == 60
    assert stop >= settings_mod.Settings().graceful_timeout + 15
    hardening = {
        "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
        "DynamicUser": "yes", "PrivateDevices": "yes", "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes", "ProtectKernelLogs": "yes", "ProtectControlGroups": "yes",
        "LockPersonality": "yes", "RestrictSUIDSGID": "yes", "RestrictRealtime": "yes",
        "RestrictNamespaces": "yes", "CapabilityBoundingSet": "",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    }
    assert {k: one(unit, s, k) for k in hardening} == hardening
    assert "User" not in unit[s]          # DynamicUser allocates it
    assert one(unit, "Install", "WantedBy") == "multi-user.target"


def test_systemd_env_example_is_valid_settings():
    env = parse_env_file(ENV_EXAMPLE)
    assert env["PGFENCE_DSN"].startswith("postgresql://")
    assert "CHANGE-ME" in env["PGFENCE_DSN"]           # a placeholder, not a password
    # Every PGFENCE_* name is one pgfence reads: a setting, or the few that
    # are not settings.  A misspelt name would otherwise be silently ignored.
    not_settings = {"PGFENCE_DSN", "PGFENCE_LOG_LEVEL", "PGFENCE_CONFIG"}
    fields = {d.env for d in settings_mod.DECLARATIONS.values() if not d.hidden}
    assert set(env) - not_settings <= fields, set(env) - not_settings - fields
    loaded = settings_mod.load({}, env=env)
    assert loaded.workers == 4
    assert loaded.queues == ("default",)
    assert loaded.graceful_timeout == 30.0
    assert (loaded.metrics_host, loaded.metrics_port) == ("127.0.0.1", METRICS_PORT)
    assert env["PGFENCE_LOG_LEVEL"] in cli.LOG_LEVELS
    # The stop timeout covers this file's drain too.
    stop = int(one(parse_unit(UNIT.read_text()), "Service", "TimeoutStopSec"))
    assert stop >= loaded.graceful_timeout + 15
    # The unit sets the metrics directory itself.
    assert "PGFENCE_METRICS_DIR" not in env


# -- Kubernetes: schemas ----------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", ["deployment.yaml", "service.yaml", "pdb.yaml", "secret.example.yaml"])
def test_core_manifest_is_valid_against_the_kubernetes_schema(name, version):
    k8s_validate(load_yaml(name), version)


def test_schema_validation_rejects_a_misspelt_field():
    import kubernetes_validate

    doc = load_yaml("deployment.yaml")
    doc["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 60
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(doc, "latest")
    doc = load_yaml("deployment.yaml")
    container(doc, "pgfence")["livenessProbe"]["periodSeconds"] = "10"
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(doc, "latest")


# -- Kubernetes: the Deployment -------------------------------------------------------


def test_deployment_pod_security_and_shutdown():
    dep = load_yaml("deployment.yaml")
    assert (dep["kind"], dep["metadata"]["name"]) == ("Deployment", "pgfence")
    assert dep["spec"]["selector"]["matchLabels"] == POD_LABELS
    pod = dep["spec"]["template"]
    assert pod["metadata"]["labels"] == POD_LABELS
    spec = pod["spec"]
    assert "replicas" not in dep["spec"]               # KEDA owns it
    assert spec["enableServiceLinks"] is False         # no injected PGFENCE_*_PORT=tcp://...
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 10001
    for c in spec["containers"] + spec["initContainers"]:
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001, c["name"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"] == {"drop": ["ALL"]}, c["name"]
        for kind in ("requests", "limits"):
            assert set(c["resources"][kind]) == {"cpu", "memory"}, (c["name"], kind)

    main = container(dep, "pgfence")
    assert main["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    pre_stop = int(main["lifecycle"]["preStop"]["exec"]["command"][1])
    graceful = settings_mod.load({}, env=plain_env(main)).graceful_timeout
    assert graceful == 30.0
    grace = spec["terminationGracePeriodSeconds"]
    assert grace == 60
    assert grace >= pre_stop + graceful + 15


def test_deployment_probes_ports_and_metrics_dir():
    dep = load_yaml("deployment.yaml")
    main = container(dep, "pgfence")
    assert main["ports"] == [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}]
    live, ready = main["livenessProbe"], main["readinessProbe"]
    assert live["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert ready["httpGet"] == {"path": "/readyz", "port": "metrics"}
    # A busy worker is never killed: a minute of failed checks before a restart.
    assert live["periodSeconds"] == 10 and live["failureThreshold"] == 6
    assert live["periodSeconds"] * live["failureThreshold"] >= 60

    # The arguments and environment are ones pgfence accepts, and give the
    # address, port and directory the rest of the manifest assumes.
    args = cli.build_parser().parse_args(main["args"])
    assert args.command == "run"
    cli_values = {k: getattr(args, k) for k in ("metrics_host", "metrics_port", "metrics_dir", "workers")}
    env = plain_env(main)
    loaded = settings_mod.load(cli_values, env=env)
    assert loaded.metrics_host == "0.0.0.0"        # reachable by the kubelet and Prometheus
    assert loaded.metrics_port == METRICS_PORT
    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    [metrics_volume] = [name for name, path in mounts.items() if path == loaded.metrics_dir]
    assert volumes[metrics_volume]["emptyDir"]["medium"] == "Memory"
    assert mounts["tmp"] == "/tmp" and "emptyDir" in volumes["tmp"]


def test_deployment_dsn_comes_from_the_secret():
    dep = load_yaml("deployment.yaml")
    secret = load_yaml("secret.example.yaml")
    assert (secret["kind"], secret["metadata"]["name"]) == ("Secret", "pgfence")
    assert list(secret["stringData"]) == ["PGFENCE_DSN"]
    assert "CHANGE-ME" in secret["stringData"]["PGFENCE_DSN"]
    spec = dep["spec"]["template"]["spec"]
    for c in spec["containers"] + spec["initContainers"]:
        [dsn] = [e for e in c["env"] if e["name"] == "PGFENCE_DSN"]
        assert dsn == {"name": "PGFENCE_DSN",
                       "valueFrom": {"secretKeyRef": {"name": "pgfence", "key": "PGFENCE_DSN"}}}, c["name"]
        # Nothing else in the manifest carries a connection string.
        for e in c["env"]:
            assert "postgres" not in str(e.get("value", "")), e
    [migrate] = spec["initContainers"]
    assert migrate["args"] == ["migrate"]
    assert migrate["image"] == container(dep, "pgfence")["image"]
    assert cli.build_parser().parse_args(migrate["args"]).command == "migrate"


# -- Kubernetes: what points at the Deployment ------------------------------------------


def test_service_and_pdb_select_the_pods():
    service = load_yaml("service.yaml")
    assert service["spec"]["selector"] == POD_LABELS
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}]
    ann = service["metadata"]["annotations"]
    assert ann == {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
                   "prometheus.io/path": "/metrics"}
    pdb = load_yaml("pdb.yaml")
    assert (pdb["apiVersion"], pdb["kind"]) == ("policy/v1", "PodDisruptionBudget")
    assert pdb["spec"]["selector"] == {"matchLabels": POD_LABELS}
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]


def test_podmonitor_scrapes_the_pods_metrics_port():
    pm = load_yaml("podmonitor.yaml")
    assert (pm["apiVersion"], pm["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    assert set(pm["spec"]) == {"selector", "podMetricsEndpoints"}
    selector = pm["spec"]["selector"]["matchLabels"]
    pod_labels = load_yaml("deployment.yaml")["spec"]["template"]["metadata"]["labels"]
    assert selector and selector.items() <= pod_labels.items()
    port_names = {p["name"] for p in container(load_yaml("deployment.yaml"), "pgfence")["ports"]}
    assert pm["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] in port_names


KEDA_QUERY = ("SELECT count(*) FROM pgfence.jobs WHERE queue IN ('default') "
              "AND (status = 'running' OR (status = 'queued' AND run_at <= now()))")


def test_keda_scaledobject_targets_the_deployment():
    so = load_yaml("keda-scaledobject.yaml")
    dep = load_yaml("deployment.yaml")
    assert (so["apiVersion"], so["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    ref = so["spec"]["scaleTargetRef"]
    assert ref == {"apiVersion": "apps/v1", "kind": "Deployment", "name": dep["metadata"]["name"],
                   "envSourceContainerName": "pgfence"}
    assert 1 <= so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"]
    [trigger] = so["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    meta = trigger["metadata"]
    assert set(meta) == {"connectionFromEnv", "query", "targetQueryValue", "activationTargetQueryValue"}
    # KEDA's trigger metadata is a map of strings.
    assert all(isinstance(v, str) for v in meta.values()), meta
    assert meta["query"] == KEDA_QUERY
    # The DSN variable exists in the container KEDA reads its environment from.
    main = container(dep, ref["envSourceContainerName"])
    [dsn] = [e for e in main["env"] if e["name"] == meta["connectionFromEnv"]]
    assert dsn["valueFrom"]["secretKeyRef"]["key"] == "PGFENCE_DSN"
    # One pod runs PGFENCE_WORKERS jobs at once; the query counts the
    # Deployment's own queues.
    env = plain_env(main)
    assert int(meta["targetQueryValue"]) == int(env["PGFENCE_WORKERS"]) == 4
    queues = re.search(r"queue IN \(([^)]*)\)", meta["query"]).group(1)
    assert [q.strip().strip("'") for q in queues.split(",")] == env["PGFENCE_QUEUES"].split(",")


def test_keda_query_counts_running_and_due_jobs_of_the_queues(conn):
    # Due on the Deployment's queue: two queued, one of them claimed below.
    enqueue(conn, "noop", {})
    enqueue(conn, "noop", {})
    claimed = enqueue(conn, "noop", {}, priority=100)
    conn.execute("UPDATE pgfence.jobs SET status = 'running', attempt = 1, locked_by = 't', "
                 "lease_until = now() + interval '30 seconds' WHERE id = %s", (claimed,))
    enqueue(conn, "noop", {}, delay=3600)                        # not due yet
    enqueue(conn, "noop", {}, queue="mail")                      # another queue
    done = enqueue(conn, "noop", {})
    finish(conn, done)
    query = load_yaml("keda-scaledobject.yaml")["spec"]["triggers"][0]["metadata"]["query"]
    [(count,)] = conn.execute(query).fetchall()
    assert count == 3


def test_kustomization_lists_the_manifests():
    kz = load_yaml("kustomization.yaml")
    assert (kz["apiVersion"], kz["kind"]) == ("kustomize.config.k8s.io/v1beta1", "Kustomization")
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert sorted(kz["resources"]) == sorted(on_disk)
    assert len(kz["resources"]) == len(set(kz["resources"]))
    # The example Secret is never applied over the real one.
    assert "secret.example.yaml" not in kz["resources"]
    # The image override applies to the images the Deployment names.
    spec = load_yaml("deployment.yaml")["spec"]["template"]["spec"]
    images = {c["image"].split(":")[0] for c in spec["containers"] + spec["initContainers"]}
    assert images == {i["name"] for i in kz["images"]} == {"pgfence"}


# -- Docker ---------------------------------------------------------------------------


def test_dockerfile_runs_pgfence_as_a_non_root_user_without_secrets():
    instructions = parse_dockerfile(DOCKERFILE.read_text())
    stage = final_stage(instructions)
    assert stage[0] == ("FROM", "python:3.11-slim")
    assert instructions[0] == ("FROM", "python:3.11-slim AS build")
    users = [args for ins, args in stage if ins == "USER"]
    assert users == ["10001:10001"]
    assert [ins for ins, _ in stage].index("USER") > max(i for i, (ins, _) in enumerate(stage) if ins == "RUN")
    assert [args for ins, args in stage if ins == "EXPOSE"] == [str(METRICS_PORT)]
    assert [args for ins, args in stage if ins == "STOPSIGNAL"] == ["SIGTERM"]
    assert [json.loads(args) for ins, args in stage if ins == "ENTRYPOINT"] == [["pgfence"]]
    assert [json.loads(args) for ins, args in stage if ins == "CMD"] == [["run"]]
    env = dockerfile_env(stage)
    assert env["PGFENCE_METRICS_DIR"] == "/run/pgfence"
    assert any("install -d -o 10001 -g 10001 -m 0700 /run/pgfence" in args for ins, args in stage if ins == "RUN")
    # Settings baked in are valid, and put the endpoint where EXPOSE says.
    pgfence_env = {k: v for k, v in env.items() if k.startswith("PGFENCE_")}
    loaded = settings_mod.load({}, env=pgfence_env)
    assert (loaded.metrics_host, loaded.metrics_port, loaded.metrics_dir) == ("0.0.0.0", METRICS_PORT, "/run/pgfence")
    # No connection string or password in any stage.
    for ins, args in instructions:
        if ins in ("ENV", "ARG", "LABEL", "RUN"):
            assert not re.search(r"DSN|DATABASE_URL|PASSWORD|postgres(ql)?://", args, re.IGNORECASE), (ins, args)


def test_dockerfile_copies_what_the_package_build_needs():
    instructions = parse_dockerfile(DOCKERFILE.read_text())
    sources = set()
    for ins, args in instructions:
        if ins == "COPY" and not args.startswith("--from"):
            sources.update(shlex.split(args)[:-1])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"]}
    # Every package lives in the folder package-dir maps it (or its nearest
    # parent) to: pgfence.cli in supervisor/, pgfence.sql.queries in sql/.
    package_dir = project["tool"]["setuptools"]["package-dir"]
    for package in project["tool"]["setuptools"]["packages"]:
        parent = max((p for p in package_dir if package == p or package.startswith(p + ".")), key=len)
        needed.add(package_dir[parent].split("/")[0])
    assert {"supervisor", "handlers", "sql"} <= needed
    assert needed <= sources, needed - sources
    for source in sources:
        assert (ROOT / source).exists(), source
    # The wheel path, as users install it and .ci/wheel-smoke checks: build a
    # wheel, install the wheel (never the source tree, never editable).
    # The wheel is named by the glob, not by the version, so a new version
    # needs no edit here.
    runs = [args for ins, args in instructions if ins == "RUN"]
    build = runs.index("/opt/pgfence/bin/pip wheel --no-deps --wheel-dir /dist .")
    install = runs.index("/opt/pgfence/bin/pip install /dist/pgfence-*.whl")
    assert build < install
    assert not [r for r in runs if re.search(r"pip install (-e |--editable )?\.(\s|$)", r)], runs
    assert "LICENSE" in sources
    # .dockerignore keeps the bulky and private things out, and none of what
    # the COPY lines need.
    ignored = {ln.strip() for ln in DOCKERIGNORE.read_text().splitlines()
               if ln.strip() and not ln.startswith("#")}
    assert {".venv", ".git", ".pgfence", "**/__pycache__"} <= ignored
    assert not sources & ignored


def health_server(status: int, paths: list[str]) -> http.server.ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 answering every GET with ``status``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            paths.append(self.path)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_dockerfile_healthcheck_command_follows_healthz():
    stage = final_stage(parse_dockerfile(DOCKERFILE.read_text()))
    [health] = [args for ins, args in stage if ins == "HEALTHCHECK"]
    options, _, command = health.partition(" CMD ")
    assert "--interval=10s" in options and "--retries=6" in options
    argv = json.loads(command)
    assert argv[0] == "python"
    argv[0] = sys.executable

    def run(port: int) -> int:
        return subprocess.run(argv, env={"PGFENCE_METRICS_PORT": str(port), "PATH": "/usr/bin:/bin"},
                              capture_output=True, timeout=30, check=False).returncode

    for status, expected_ok in ((200, True), (503, False)):
        paths: list[str] = []
        server = health_server(status, paths)
        try:
            assert (run(server.server_address[1]) == 0) is expected_ok, status
        finally:
            server.shutdown()
            server.server_close()
        assert paths == ["/healthz"]
    assert run(server.server_address[1]) != 0          # nothing listening any more


# -- Licence and the example Grafana data source ------------------------------------


def test_licence_file_is_the_mit_licence_the_package_declares():
    text = LICENSE.read_text()
    assert text.splitlines()[:3] == ["MIT License", "", "Copyright (c) 2026 the pgfence developers"]
    assert "Permission is hereby granted, free of charge" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in text
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "MIT"


def test_example_grafana_datasource_is_not_the_default():
    """Provisioned into an existing Grafana, the example must neither become
    its default data source nor take over one it already has by name."""
    provisioned = yaml.safe_load(GRAFANA_DATASOURCES.read_text())
    [source] = provisioned["datasources"]
    assert source["isDefault"] is False
    assert (source["name"], source["uid"], source["type"]) == ("pgfence Prometheus", "pgfence-prometheus",
                                                              "prometheus")
