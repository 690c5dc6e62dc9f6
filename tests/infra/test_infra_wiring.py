"""The deployment files are checked statically: there is no Docker engine or cluster on this machine.

Each check reads the files the way Compose, kubectl/KubeRay, the Ray cluster launcher or `docker build`
would and compares them with each other and with the code that reads them: every address an env var or
flag names is a service that listens on that port; every reference (depends_on, volumes, secrets,
ConfigMaps, selectors) resolves; only the API and MLflow are published; every env var is read by
layerlab or by the library it is meant for; every command names a real `layerlab` subcommand or `ray
start` flag. The `*_catches_*` tests break a copy of the files and expect the check to say so.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from service.cli import ENV_VARS, app
from service.settings import Settings
from tests.infra.deploy_files import (
    DOCS,
    INFRA,
    K8S,
    LAUNCHER_ENV,
    LAUNCHER_FILE,
    ROOT,
    SCRIPTS,
    Pod,
    addresses_in,
    command_words,
    containers,
    copy_instructions,
    dockerfile,
    dockerignored,
    flag_value,
    image_repo,
    invocations,
    is_our_image,
    k8s_docs,
    k8s_pods,
    k8s_service_for_host,
    k8s_services,
    load_compose,
    ray_start_commands,
    service_env,
    shell_words,
)

RAY_GCS_PORT = 6380
# Ray's dashboard / job API and its client server: never reachable from outside the stack.
RAY_PRIVATE_PORTS = {8265, 10001, RAY_GCS_PORT}
PUBLISHED = {"api": 8000, "mlflow": 5000}
THIRD_PARTY_IMAGES = {"postgres", "minio", "mc"}
# Browsers' address of MLflow, not one inside the stack: checked against MLflow's allowed hosts instead.
PUBLIC_URL_VARS = {"LAYERLAB_MLFLOW_UI_URL"}
SECRETS_DIR = INFRA / "secrets"


def _fmt(problems: list[str]) -> str:
    return "\n".join(problems)


# --- Compose: who listens where ----------------------------------------------------------------


def _script_words(words: list[str]) -> list[str]:
    """A command that runs one of infra/scripts' scripts, read as that script's text."""
    if words and words[0].endswith(".sh") and (SCRIPTS / words[0]).is_file():
        return shell_words((SCRIPTS / words[0]).read_text())
    return words


def compose_listen_ports(service: dict[str, Any]) -> set[int]:
    image, words = service["image"], command_words(service.get("command"))
    repo = image_repo(image)
    if repo == "postgres":
        return {5432}  # the image's port; no `-p` in the command
    if repo == "minio":
        return {int((flag_value(words, "--address") or ":9000").rsplit(":", 1)[1])}
    if is_our_image(image):
        port = flag_value(_script_words(words), "--port")
        return {int(port)} if port else set()
    return set()


def compose_address_problems(compose: dict[str, Any]) -> tuple[list[str], int]:
    services = compose["services"]
    listen = {name: compose_listen_ports(svc) for name, svc in services.items()}
    problems, checked = [], 0
    for name, svc in services.items():
        sources = [(k, v) for k, v in service_env(svc).items() if k not in PUBLIC_URL_VARS]
        for ray_start in ray_start_commands(command_words(svc.get("command"))):
            sources.append(("--address", flag_value(ray_start, "--address") or ""))
        for key, value in sources:
            for addr in addresses_in(key, value):
                checked += 1
                if addr.host not in services:
                    problems.append(f"{name}: {key} points at {addr.host!r}, which is no compose service")
                elif addr.port not in listen[addr.host]:
                    problems.append(
                        f"{name}: {key} points at {addr.host}:{addr.port}, but {addr.host} listens on "
                        f"{sorted(listen[addr.host]) or 'no port'}"
                    )
    return problems, checked


def test_compose_addresses_name_services_that_listen_on_that_port() -> None:
    problems, checked = compose_address_problems(load_compose())
    assert not problems, _fmt(problems)
    # postgres x4, minio x8, mlflow x4, ray-head x4 (env and --address): the check saw them all
    assert checked >= 18, checked


def test_compose_address_check_catches_a_wrong_port_and_a_missing_service() -> None:
    compose = load_compose()
    compose["services"]["api"]["environment"]["LAYERLAB_MLFLOW_TRACKING_URI"] = "http://mlflow:5001"
    compose["services"]["worker"]["environment"]["RAY_ADDRESS"] = "ray-head:6379"
    compose["services"]["ray-worker"]["command"] = ["ray", "start", "--address=head:6380", "--block"]
    problems, _ = compose_address_problems(compose)
    assert any("api: LAYERLAB_MLFLOW_TRACKING_URI points at mlflow:5001" in p for p in problems), problems
    assert any("worker: RAY_ADDRESS points at ray-head:6379, but ray-head listens on [6380]" in p for p in problems)
    assert any("ray-worker: --address points at 'head'" in p for p in problems), problems


# --- Compose: references, images, ports, health ------------------------------------------------


def compose_reference_problems(compose: dict[str, Any]) -> list[str]:
    services = compose["services"]
    volumes = set(compose.get("volumes") or {})
    secrets = compose.get("secrets") or {}
    problems = []
    for name, svc in services.items():
        for target, dep in (svc.get("depends_on") or {}).items():
            condition = dep.get("condition", "service_started") if isinstance(dep, dict) else "service_started"
            if target not in services:
                problems.append(f"{name}: depends_on {target!r}, which is no service")
                continue
            if condition == "service_healthy" and "test" not in (services[target].get("healthcheck") or {}):
                problems.append(f"{name}: waits for {target} to be healthy, but {target} has no healthcheck")
            if condition == "service_completed_successfully" and services[target].get("restart", "no") != "no":
                problems.append(f"{name}: waits for {target} to complete, but {target} restarts (restart: no)")
        for mount in svc.get("volumes") or []:
            source = mount.split(":", 1)[0] if isinstance(mount, str) else mount.get("source", "")
            if source.startswith((".", "/")):
                if not (INFRA / source).resolve().exists():
                    problems.append(f"{name}: mounts {source}, which does not exist next to the compose file")
            elif source not in volumes:
                problems.append(f"{name}: uses volume {source!r}, not declared under volumes:")
        mounted = {s if isinstance(s, str) else s["source"] for s in svc.get("secrets") or []}
        for secret in mounted - set(secrets):
            problems.append(f"{name}: uses secret {secret!r}, not declared under secrets:")
        for key, value in service_env(svc).items():
            m = re.fullmatch(r"/run/secrets/(\w+)", value)
            if key.endswith("_FILE") and m and m.group(1) not in mounted:
                problems.append(f"{name}: {key}={value}, but the service does not mount secret {m.group(1)!r}")
    for secret, spec in secrets.items():
        path = (INFRA / spec["file"]).resolve()
        if path.parent != SECRETS_DIR.resolve():
            problems.append(f"secret {secret}: file {spec['file']} is not in infra/secrets/")
    return problems


def test_compose_references_resolve() -> None:
    problems = compose_reference_problems(load_compose())
    assert not problems, _fmt(problems)


def test_compose_reference_check_catches_dangling_references() -> None:
    compose = load_compose()
    compose["services"]["api"]["depends_on"]["migrations"] = {"condition": "service_completed_successfully"}
    compose["services"]["worker"]["depends_on"]["minio-init"] = {"condition": "service_healthy"}
    compose["services"]["postgres"]["volumes"][0] = "pgdata:/var/lib/postgresql/data"
    compose["services"]["mlflow"]["secrets"].remove("mlflow_admin_password")
    compose["secrets"]["ray_auth_token"]["file"] = "./ray_auth_token"
    problems = compose_reference_problems(compose)
    for expected in (
        "api: depends_on 'migrations'",
        "worker: waits for minio-init to be healthy",
        "postgres: uses volume 'pgdata'",
        "mlflow: LAYERLAB_MLFLOW_ADMIN_PASSWORD_FILE=/run/secrets/mlflow_admin_password, but",
        "secret ray_auth_token: file ./ray_auth_token is not in infra/secrets/",
    ):
        assert any(expected in p for p in problems), (expected, problems)


def test_compose_images_are_ours_except_postgres_and_minio() -> None:
    compose = load_compose()
    ours = {name for name, svc in compose["services"].items() if is_our_image(svc["image"])}
    others = {image_repo(svc["image"]) for name, svc in compose["services"].items() if name not in ours}
    assert others == THIRD_PARTY_IMAGES, others
    assert ours == {"mlflow", "migrate", "api", "ray-head", "ray-worker", "worker"}
    for name in ours:
        build = compose["services"][name]["build"]
        assert (INFRA / build["context"]).resolve() == ROOT, (name, build)
        assert build["dockerfile"] == "Dockerfile"
        # every build arg is one the Dockerfile declares
        declared = {ins.args.split("=", 1)[0] for ins in dockerfile() if ins.keyword == "ARG"}
        assert set(build.get("args", {})) <= declared, (name, build.get("args"))


def published_ports(compose: dict[str, Any]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for name, svc in compose["services"].items():
        for port in svc.get("ports") or []:
            target = int(port["target"]) if isinstance(port, dict) else int(str(port).rsplit(":", 1)[-1].split("/")[0])
            out.setdefault(name, set()).add(target)
    return out


def test_compose_publishes_only_the_api_and_mlflow() -> None:
    compose = load_compose()
    assert published_ports(compose) == {name: {port} for name, port in PUBLISHED.items()}
    for name, svc in compose["services"].items():
        # host networking or `expose` of Ray's ports would bypass the check above
        assert svc.get("network_mode") != "host", name
        assert not RAY_PRIVATE_PORTS & {int(p) for p in svc.get("expose") or []}, name
    for port in compose["services"]["api"]["ports"] + compose["services"]["mlflow"]["ports"]:
        assert port["host_ip"] == "127.0.0.1", "published on loopback unless PUBLISH_ADDRESS opens it"
    opened = load_compose({"PUBLISH_ADDRESS": "0.0.0.0"})
    assert {p["host_ip"] for s in ("api", "mlflow") for p in opened["services"][s]["ports"]} == {"0.0.0.0"}


def test_compose_healthchecks_probe_what_the_service_serves() -> None:
    services = load_compose()["services"]
    for name, path in (("api", "/healthz"), ("mlflow", "/health")):
        check = services[name]["healthcheck"]["test"]
        assert check[:2] == ["CMD", "curl"], check
        assert check[-1] == f"http://127.0.0.1:{PUBLISHED[name]}{path}", check
    assert services["ray-head"]["healthcheck"]["test"][1:] == ["ray", "health-check", "--address", "127.0.0.1:6380"]
    # The image's own HEALTHCHECK is the API's: every other role of our image states its own, or none.
    for name, svc in services.items():
        if is_our_image(svc["image"]):
            assert "healthcheck" in svc, f"{name} would inherit the API's healthcheck from the image"


def test_compose_ray_worker_reserves_gpus_with_a_replicas_knob() -> None:
    worker = load_compose()["services"]["ray-worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] and d["driver"] == "nvidia" for d in devices), devices
    assert worker["deploy"]["replicas"] == "0", "no GPU node unless RAY_GPU_WORKERS asks for one"
    assert load_compose({"RAY_GPU_WORKERS": "1"})["services"]["ray-worker"]["deploy"]["replicas"] == "1"
    assert load_compose({"QUEUE_WORKERS": "3"})["services"]["worker"]["deploy"]["replicas"] == "3"


def test_compose_shared_memory_for_every_ray_node() -> None:
    # Ray's object store lives in /dev/shm; Docker's default is 64 MB.
    for name, svc in load_compose()["services"].items():
        words = command_words(svc.get("command"))
        if list(ray_start_commands(words)) or words == ["layerlab-worker.sh"]:
            assert svc.get("shm_size"), name


# --- MLflow's Host allow-list, databases, bucket ---------------------------------------------


def _host_port(url: str) -> str:
    m = re.match(r"https?://([^/]+)", url)
    assert m, url
    return m.group(1)


def allowed_hosts_problems(allowed: str, client_urls: dict[str, str]) -> list[str]:
    hosts = set(allowed.split(","))
    return [
        f"{who} reaches MLflow as {_host_port(url)}, not in {allowed}"
        for who, url in client_urls.items()
        if _host_port(url) not in hosts
    ]


def test_mlflow_accepts_the_host_names_its_clients_use() -> None:
    for env in ({}, {"MLFLOW_PUBLIC_HOST": "mlflow.example.org", "MLFLOW_PUBLIC_URL": "https://mlflow.example.org"}):
        services = load_compose(env)["services"]
        clients = {
            f"{name}: {key}": value
            for name, svc in services.items()
            for key, value in service_env(svc).items()
            if key in ("LAYERLAB_MLFLOW_TRACKING_URI", "LAYERLAB_MLFLOW_UI_URL")
        }
        assert len(clients) >= 5
        allowed = service_env(services["mlflow"])["LAYERLAB_MLFLOW_ALLOWED_HOSTS"]
        assert not allowed_hosts_problems(allowed, clients), allowed_hosts_problems(allowed, clients)
        assert {"localhost:5000", "127.0.0.1:5000"} <= set(allowed.split(",")), "the list replaces MLflow's default"
    config = next(
        obj for _, obj in k8s_docs() if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "layerlab-env"
    )
    data = config["data"]
    k8s_clients = {k: data[k] for k in ("LAYERLAB_MLFLOW_TRACKING_URI", "LAYERLAB_MLFLOW_UI_URL")}
    assert not allowed_hosts_problems(data["LAYERLAB_MLFLOW_ALLOWED_HOSTS"], k8s_clients)
    # and the check is not vacuous
    assert allowed_hosts_problems("localhost:5000", {"api": "http://mlflow:5000"})


def _created_databases(postgres_env: dict[str, str], init_sql: str) -> set[str]:
    created = set(re.findall(r"CREATE DATABASE (\w+)", init_sql))
    return created | {postgres_env.get("POSTGRES_DB") or postgres_env["POSTGRES_USER"]}


def _urls(values: list[str], scheme: str) -> list[str]:
    return [v for v in values if v.startswith(scheme)]


def test_every_database_and_bucket_the_stack_uses_is_created() -> None:
    init_sql = (INFRA / "postgres" / "init-databases.sql").read_text()
    compose = load_compose()
    services = compose["services"]
    values = [v for svc in services.values() for v in service_env(svc).values()]
    wanted = {u.rsplit("/", 1)[1] for u in _urls(values, "postgresql")}
    assert wanted == {"layerlab", "mlflow", "mlflow_auth"}
    assert wanted <= _created_databases(service_env(services["postgres"]), init_sql)
    assert "./postgres/init-databases.sql:/docker-entrypoint-initdb.d/" in services["postgres"]["volumes"][1]
    buckets = {u.split("/")[2] for u in _urls(values, "s3://")}
    assert buckets == {service_env(services["minio-init"])["S3_BUCKET"]}
    # the user minio-init creates is the one every S3 client uses
    users = {env["AWS_ACCESS_KEY_ID"] for env in map(service_env, services.values()) if "AWS_ACCESS_KEY_ID" in env}
    assert users == {service_env(services["minio-init"])["S3_ACCESS_KEY_ID"]}

    # Kubernetes: the same databases and bucket, from copies of the same files.
    objects = {(obj["kind"], obj["metadata"]["name"]): obj for _, obj in k8s_docs()}
    k8s_sql = objects[("ConfigMap", "postgres-init")]["data"]["10-databases.sql"]
    assert k8s_sql == init_sql, "infra/k8s/postgres.yaml's copy of init-databases.sql differs"
    k8s_script = objects[("ConfigMap", "minio-init")]["data"]["minio-init.sh"]
    assert k8s_script == (SCRIPTS / "minio-init.sh").read_text(), "infra/k8s/minio.yaml's copy of minio-init.sh differs"
    config = objects[("ConfigMap", "layerlab-env")]["data"]
    k8s_wanted = {u.rsplit("/", 1)[1] for u in _urls(list(config.values()), "postgresql")}
    pg_env = {
        e["name"]: e.get("value", "")
        for e in objects[("StatefulSet", "postgres")]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert k8s_wanted == wanted and k8s_wanted <= _created_databases(pg_env, k8s_sql)
    job_env = {
        e["name"]: e.get("value")
        for e in objects[("Job", "minio-init")]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert {u.split("/")[2] for u in _urls(list(config.values()), "s3://")} == {job_env["S3_BUCKET"]}


# --- Kubernetes ----------------------------------------------------------------------------------


def _env_sources(container: dict[str, Any]) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """(plain env values, valueFrom references) of a container."""
    values, refs = {}, []
    for e in container.get("env", []):
        if "valueFrom" in e:
            refs.append(e["valueFrom"])
        else:
            values[e["name"]] = str(e.get("value", ""))
    return values, refs


def k8s_reference_problems(objects: tuple[tuple[str, dict[str, Any]], ...]) -> list[str]:
    names = {(obj["kind"], obj["metadata"]["name"]) for _, obj in objects}
    secret_keys = {
        key
        for _, obj in objects
        if obj["kind"] == "Secret"
        for key in {**obj.get("stringData", {}), **obj.get("data", {})}
    }
    config_keys = {
        (obj["metadata"]["name"], key)
        for _, obj in objects
        if obj["kind"] == "ConfigMap"
        for key in obj.get("data", {})
    }
    problems = []
    pods = list(k8s_pods(objects))
    for pod in pods:
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        for c in containers(pod):
            where = f"{pod.owner}/{c['name']}"
            for source in c.get("envFrom", []):
                if ("ConfigMap", source["configMapRef"]["name"]) not in names:
                    problems.append(f"{where}: envFrom ConfigMap {source['configMapRef']['name']!r} does not exist")
            for ref in _env_sources(c)[1]:
                if "secretKeyRef" in ref and ref["secretKeyRef"]["key"] not in secret_keys:
                    problems.append(f"{where}: Secret key {ref['secretKeyRef']['key']!r} is not in the Secret template")
                if "configMapKeyRef" in ref:
                    key = (ref["configMapKeyRef"]["name"], ref["configMapKeyRef"]["key"])
                    if key not in config_keys:
                        problems.append(f"{where}: ConfigMap key {key} does not exist")
            for mount in c.get("volumeMounts", []):
                if mount["name"] not in volumes and mount["name"] not in pod.claim_volumes:
                    problems.append(f"{where}: mounts volume {mount['name']!r}, which the pod does not define")
        for volume in volumes.values():
            if "configMap" in volume and ("ConfigMap", volume["configMap"]["name"]) not in names:
                problems.append(f"{pod.owner}: volume ConfigMap {volume['configMap']['name']!r} does not exist")
            for item in (volume.get("secret") or {}).get("items", []):
                if item["key"] not in secret_keys:
                    problems.append(f"{pod.owner}: volume uses Secret key {item['key']!r}, not in the template")
    for name, svc in k8s_services(objects).items():
        if svc.owner_pod:
            continue
        selected = [p for p in pods if svc.selector and svc.selector.items() <= p.labels.items()]
        if not selected:
            problems.append(f"Service {name}: its selector {svc.selector} matches no pod")
        for port, target in svc.ports.items():
            for pod in selected:
                declared = {
                    (p.get("name"), p["containerPort"]) for c in pod.spec["containers"] for p in c.get("ports", [])
                }
                if not any(target in pair for pair in declared):
                    problems.append(
                        f"Service {name}: port {port} targets {target!r}, which {pod.owner} does not declare"
                    )
    return problems


def test_k8s_references_resolve() -> None:
    problems = k8s_reference_problems(k8s_docs())
    assert not problems, _fmt(problems)


def test_k8s_reference_check_catches_dangling_references() -> None:
    objects = copy.deepcopy(k8s_docs())
    for _, obj in objects:
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == "mlflow":
            obj["spec"]["template"]["spec"]["containers"][0]["env"][2]["valueFrom"]["secretKeyRef"]["key"] = "pg_pass"
        if obj["kind"] == "Service" and obj["metadata"]["name"] == "api":
            obj["spec"]["ports"][0]["targetPort"] = "web"
    problems = k8s_reference_problems(objects)
    assert any("Deployment/mlflow/mlflow: Secret key 'pg_pass'" in p for p in problems), problems
    assert any("Service api: port 8000 targets 'web'" in p for p in problems), problems


def _pod_env(pod: Pod, container: dict[str, Any]) -> dict[str, str]:
    """What a container sees: its envFrom ConfigMaps, then its plain env values."""
    config_maps = {obj["metadata"]["name"]: obj["data"] for _, obj in k8s_docs() if obj["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(config_maps[source["configMapRef"]["name"]])
    env.update(_env_sources(container)[0])
    return env


def _resolved_pod_env(pod: Pod, container: dict[str, Any]) -> dict[str, str]:
    """_pod_env plus valueFrom: ConfigMap keys resolved, Secret keys as `<secret KEY>`."""
    config_maps = {obj["metadata"]["name"]: obj["data"] for _, obj in k8s_docs() if obj["kind"] == "ConfigMap"}
    env = _pod_env(pod, container)
    for e in container.get("env", []):
        ref = e.get("valueFrom", {})
        if "configMapKeyRef" in ref:
            env[e["name"]] = config_maps[ref["configMapKeyRef"]["name"]][ref["configMapKeyRef"]["key"]]
        elif "secretKeyRef" in ref:
            env[e["name"]] = f"<secret {ref['secretKeyRef']['key']}>"
    return env


def test_k8s_addresses_name_services_that_listen_on_that_port() -> None:
    services = k8s_services()
    problems, checked = [], 0
    for pod in k8s_pods():
        for c in containers(pod):
            sources = [(k, v) for k, v in _pod_env(pod, c).items() if k not in PUBLIC_URL_VARS]
            words = command_words(c.get("command")) + command_words(c.get("args"))
            for ray_start in ray_start_commands(_script_words(words)):
                sources.append(("--address", flag_value(ray_start, "--address") or ""))
            for key, value in sources:
                for addr in addresses_in(key, value):
                    checked += 1
                    name = k8s_service_for_host(addr.host)
                    if name not in services:
                        problems.append(f"{pod.owner}/{c['name']}: {key} points at {addr.host}, which is no Service")
                    elif addr.port not in services[name].ports:
                        problems.append(f"{pod.owner}/{c['name']}: {key} points at port {addr.port} of {name}")
    assert not problems, _fmt(problems)
    assert checked >= 30, checked
    # the head Service forwards the port the GCS listens on
    head = next(p for p in k8s_pods() if p.ray_node_type == "head")
    assert head.ray_start_params and int(head.ray_start_params["port"]) in services["ray-head"].ports


def test_k8s_ray_head_is_reachable_only_inside_the_cluster() -> None:
    services = k8s_services()
    ray_pods = [p for p in k8s_pods() if p.ray_node_type]
    for name, svc in services.items():
        selects_ray = svc.owner_pod is not None or any(
            svc.selector.items() <= p.labels.items() for p in ray_pods if svc.selector
        )
        if selects_ray:
            assert svc.type == "ClusterIP", f"Service {name} exposes Ray as {svc.type}"
            assert not {8265, 10001} & set(svc.ports), f"Service {name} forwards Ray's dashboard or client port"
    assert not [obj for _, obj in k8s_docs() if obj["kind"] in ("Ingress", "Route", "Gateway", "HTTPRoute")]
    for pod in ray_pods:
        params = pod.ray_start_params or {}
        assert params.get("dashboard-host") in (None, "127.0.0.1"), pod.owner
        if pod.ray_node_type == "head":
            assert params["include-dashboard"] == "false"
            assert int(params["port"]) == RAY_GCS_PORT
        for c in pod.spec["containers"]:
            # Without our probes KubeRay injects ones that ask the dashboard agent, absent from the image.
            for probe in ("readinessProbe", "livenessProbe"):
                assert c[probe]["exec"]["command"][:2] == ["ray", "health-check"], (pod.owner, probe)


def test_k8s_images_users_and_gpus() -> None:
    dockerfile_user = next(ins.args for ins in reversed(dockerfile()) if ins.keyword == "USER")
    uid = int(dockerfile_user.split(":", 1)[0])
    for pod in k8s_pods():
        for c in containers(pod):
            repo = image_repo(c["image"])
            assert is_our_image(c["image"]) or repo in THIRD_PARTY_IMAGES, (pod.owner, c["image"])
        if all(is_our_image(c["image"]) for c in containers(pod)):
            assert pod.spec["securityContext"]["runAsNonRoot"] is True, pod.owner
            assert pod.spec["securityContext"]["runAsUser"] == uid, pod.owner
    gpu_groups = [
        p
        for p in k8s_pods()
        if any("nvidia.com/gpu" in c.get("resources", {}).get("limits", {}) for c in p.spec["containers"])
    ]
    assert [p.owner for p in gpu_groups] == ["RayCluster/layerlab/gpu"]
    assert gpu_groups[0].spec["containers"][0]["image"].endswith(":cuda")


def test_k8s_networkpolicy_covers_every_ray_node() -> None:
    policy = next(obj for _, obj in k8s_docs() if obj["kind"] == "NetworkPolicy")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    ray_nodes = [
        p
        for p in k8s_pods()
        if p.ray_node_type or any("layerlab-worker.sh" in command_words(c.get("args")) for c in p.spec["containers"])
    ]
    assert len(ray_nodes) == 4  # head, cpu and gpu groups, queue workers
    for pod in ray_nodes:
        assert selector.items() <= pod.labels.items(), f"{pod.owner} is a Ray node outside the NetworkPolicy"
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": selector}}]}]


def test_kustomization_applies_every_manifest_but_the_secret_template() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == manifests - {"secret.example.yaml"}
    assert [i["name"] for i in kustomization["images"]] == ["layerlab"]
    template = yaml.safe_load((K8S / "secret.example.yaml").read_text())
    assert set(template["stringData"].values()) == {"REPLACE-ME"}, "the template holds no real values"
    namespaced = [obj for _, obj in k8s_docs() if obj["kind"] != "Namespace"]
    assert {obj["metadata"]["namespace"] for obj in namespaced} == {"layerlab"}


# --- Ray: token auth, flags, cluster launcher -------------------------------------------------


def _launcher_env() -> dict[str, str]:
    lines = [line for line in LAUNCHER_ENV.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def test_every_ray_process_uses_token_auth() -> None:
    compose = load_compose()
    for name, svc in compose["services"].items():
        words = command_words(svc.get("command"))
        if list(ray_start_commands(_script_words(words))):
            env = service_env(svc)
            assert env.get("RAY_AUTH_MODE") == "token", name
            token = env["RAY_AUTH_TOKEN_PATH"].removeprefix("/run/secrets/")
            assert token in svc["secrets"], name
    for pod in k8s_pods():
        for c in pod.spec["containers"]:
            if pod.ray_node_type or list(ray_start_commands(_script_words(command_words(c.get("args"))))):
                env = _resolved_pod_env(pod, c)
                assert env.get("RAY_AUTH_MODE") == "token", pod.owner
                assert env.get("RAY_AUTH_TOKEN") == "<secret ray_auth_token>", pod.owner
                if pod.ray_node_type:
                    # KubeRay copies `env` (not envFrom) into the init container that waits for the GCS
                    assert "RAY_AUTH_MODE" in {e["name"] for e in c["env"]}, pod.owner
    env = _launcher_env()
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"].startswith("/run/secrets/")


@pytest.fixture(scope="module")
def ray_start_flags() -> set[str]:
    from ray.scripts.scripts import cli

    return {opt for param in cli.commands["start"].params for opt in param.opts}


def _all_ray_starts() -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for name, svc in load_compose()["services"].items():
        found += [(f"compose {name}", w) for w in ray_start_commands(command_words(svc.get("command")))]
    for script in SCRIPTS.glob("*.sh"):
        found += [(script.name, w) for w in ray_start_commands(shell_words(script.read_text()))]
    launcher = yaml.safe_load(LAUNCHER_FILE.read_text())
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        for line in launcher[key]:
            found += [(f"ray-cluster.yaml {key}", w) for w in ray_start_commands(shell_words(line))]
    return found


def test_ray_start_flags_exist_and_the_gcs_port_is_6380(ray_start_flags: set[str]) -> None:
    starts = _all_ray_starts()
    assert len(starts) == 5, starts  # compose head+worker, layerlab-worker.sh, launcher head+worker
    for where, words in starts:
        for word in words[2:]:
            if word.startswith("-"):
                assert word.split("=", 1)[0] in ray_start_flags, f"{where}: `ray start` has no flag {word}"
        if "--head" in words:
            assert flag_value(words, "--port") == str(RAY_GCS_PORT), where
            assert flag_value(words, "--include-dashboard") == "false", where
            assert flag_value(words, "--dashboard-host") is None, where
        else:
            address = flag_value(words, "--address") or ""
            # a $VARIABLE is the environment's, which the address tests check
            assert address.startswith("$") or address.endswith(f":{RAY_GCS_PORT}"), where
    for pod in k8s_pods():
        for key in pod.ray_start_params or {}:
            assert f"--{key}" in ray_start_flags, f"{pod.owner}: rayStartParams {key} is no `ray start` flag"


def test_ray_cluster_launcher_config_is_valid_and_runs_our_image() -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load(LAUNCHER_FILE.read_text())
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)  # Ray's own schema and checks, as `ray up` runs them
    assert config["provider"]["type"] == "local"
    docker = config["docker"]
    assert is_our_image(docker["image"]) and is_our_image(docker["worker_image"])
    assert docker["worker_image"].endswith(":cuda")
    options = " ".join(
        docker["run_options"] + docker.get("head_run_options", []) + docker.get("worker_run_options", [])
    )
    assert not re.search(r"(^|\s)(-p|--publish)\b", options), "the launcher's containers use the host network"
    assert "/run/secrets" in options and "--env-file=/etc/layerlab/layerlab.env" in options
    for line in config["head_start_ray_commands"] + config["worker_start_ray_commands"]:
        words = shell_words(line)
        if "start" in words or "layerlab" in words:
            # docker exec skips the entrypoint: secrets must come in through with-secrets.sh
            assert "with-secrets.sh" in words, line


def test_ray_cluster_launcher_check_catches_an_invalid_config() -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load(LAUNCHER_FILE.read_text())
    config["docker"]["run_option"] = config["docker"].pop("run_options")
    with pytest.raises(Exception, match="run_option"):
        validate_config(prepare_config(config))


# --- env var names and commands against the code -----------------------------------------------

_SETTINGS_ENV = {f"LAYERLAB_{name.upper()}" for name in Settings.model_fields}
_SITE = Path(yaml.__file__).resolve().parents[1]
# Read by libraries in the image, found by name in their binaries below.
_LIBRARY_READERS = {
    "PGPASSWORD": "psycopg_binary.libs/libpq*.so*",  # libpq
    "RAY_AUTH_MODE": "ray/_raylet.so",
    "RAY_AUTH_TOKEN": "ray/_raylet.so",
    "RAY_AUTH_TOKEN_PATH": "ray/_raylet.so",
}
# Read by the third-party images (not installed here; their documented variables).
_IMAGE_ENV = {
    "postgres": {"POSTGRES_USER", "POSTGRES_DB", "POSTGRES_PASSWORD", "POSTGRES_PASSWORD_FILE", "PGDATA"},
    "minio": {"MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD", "MINIO_ROOT_PASSWORD_FILE"},
    "mc": {"MC_CONFIG_DIR"},
}


def _with_secrets_names() -> set[str]:
    m = re.search(r"for name in ([A-Z_ ]+); do", (SCRIPTS / "with-secrets.sh").read_text())
    assert m
    return set(m.group(1).split())


def _read_by_library(name: str) -> bool:
    pattern = _LIBRARY_READERS.get(name)
    return bool(pattern) and any(name.encode() in path.read_bytes() for path in _SITE.glob(pattern))


def unread_env_names(env_by_user: dict[str, tuple[str, set[str]]]) -> list[str]:
    """Env var names nothing reads. env_by_user: where -> (image repo, names)."""
    scripts = {p.name: p.read_text() for p in SCRIPTS.glob("*.sh")}
    file_vars = _with_secrets_names()
    problems = []
    for where, (repo, names) in env_by_user.items():
        for name in sorted(names):
            if repo == "mc":
                ok = (
                    name in _IMAGE_ENV["mc"]
                    or f"${name}" in scripts["minio-init.sh"]
                    or f"${{{name}" in scripts["minio-init.sh"]
                )
            elif repo in _IMAGE_ENV:
                ok = name in _IMAGE_ENV[repo]
            else:
                base = name.removesuffix("_FILE") if name.removesuffix("_FILE") in file_vars else name
                ok = base in _SETTINGS_ENV or base in ENV_VARS or _read_by_library(base)
            if not ok:
                problems.append(f"{where}: nothing reads {name}")
    return problems


def _all_env_users() -> dict[str, tuple[str, set[str]]]:
    users: dict[str, tuple[str, set[str]]] = {}
    for name, svc in load_compose()["services"].items():
        users[f"compose {name}"] = (image_repo(svc["image"]), set(service_env(svc)))
    for pod in k8s_pods():
        for c in containers(pod):
            names = set(_pod_env(pod, c)) | {e["name"] for e in c.get("env", [])}
            users[f"k8s {pod.owner}/{c['name']}"] = (image_repo(c["image"]), names)
    users["launcher.env.example"] = ("layerlab", set(_launcher_env()))
    return users


def test_every_env_var_in_the_deployment_files_is_read_by_something() -> None:
    users = _all_env_users()
    assert sum(len(names) for _, names in users.values()) > 150
    problems = unread_env_names(users)
    assert not problems, _fmt(problems)


def test_env_check_catches_a_misspelt_variable() -> None:
    users = {"compose api": ("layerlab", {"LAYERLAB_MLFLOW_TRACKING_URL", "AWS_ENDPOINT_URL", "PGPASSWORD"})}
    assert unread_env_names(users) == [
        "compose api: nothing reads AWS_ENDPOINT_URL",
        "compose api: nothing reads LAYERLAB_MLFLOW_TRACKING_URL",
    ]


@pytest.fixture(scope="module")
def layerlab_commands() -> dict[str, set[str]]:
    """Top-level subcommand -> its subcommands (empty for plain commands), as Typer registers them."""
    group = typer.main.get_command(app)
    return {name: set(getattr(cmd, "commands", {})) for name, cmd in group.commands.items()}  # type: ignore[attr-defined]


def _layerlab_invocations() -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []

    def scan(where: str, words: list[str]) -> None:
        found.extend((where, args[:2]) for args in invocations(words, "layerlab") if args)

    for name, svc in load_compose()["services"].items():
        scan(f"compose {name}", command_words(svc.get("command")))
    for pod in k8s_pods():
        for c in containers(pod):
            scan(f"k8s {pod.owner}", command_words(c.get("command")) + command_words(c.get("args")))
    for script in SCRIPTS.glob("*.sh"):
        scan(script.name, shell_words(script.read_text()))
    launcher = yaml.safe_load(LAUNCHER_FILE.read_text())
    for line in launcher["head_start_ray_commands"]:
        scan("ray-cluster.yaml", shell_words(line))
    blocks = re.findall(r"```(?:sh|bash|shell)\n(.*?)```", DOCS.read_text(), flags=re.S)
    assert blocks, "docs/run-on-a-cluster.md has no shell blocks"
    for block in blocks:
        scan("docs/run-on-a-cluster.md", shell_words(block))
    return found


def test_every_layerlab_command_line_names_a_real_subcommand(layerlab_commands: dict[str, set[str]]) -> None:
    invocations = _layerlab_invocations()
    used = {words[0] for _, words in invocations}
    assert {"serve", "worker", "migrate", "mlflow-server", "token", "submit"} <= used, used
    for where, words in invocations:
        assert words[0] in layerlab_commands, f"{where}: `layerlab {words[0]}` is no command"
        if layerlab_commands[words[0]]:
            assert len(words) > 1 and words[1] in layerlab_commands[words[0]], f"{where}: `layerlab {' '.join(words)}`"


# --- Dockerfile ------------------------------------------------------------------------------


def test_dockerfile_runs_as_non_root_with_a_healthcheck_and_a_cuda_build_arg() -> None:
    instructions = dockerfile()
    keywords = [ins.keyword for ins in instructions]
    user = next(ins.args for ins in reversed(instructions) if ins.keyword == "USER")
    assert re.fullmatch(r"[1-9]\d*(:\d+)?", user), f"USER {user}: numeric and not root (runAsNonRoot checks it)"
    assert f"--uid {user.split(':')[0]}" in " ".join(ins.args for ins in instructions if ins.keyword == "RUN")
    assert keywords.index("USER") > max(i for i, k in enumerate(keywords) if k in ("RUN", "COPY"))
    healthcheck = next(ins.args for ins in instructions if ins.keyword == "HEALTHCHECK")
    assert "curl -fsS http://127.0.0.1:8000/healthz" in healthcheck
    args = dict(ins.args.partition("=")[::2] for ins in instructions if ins.keyword == "ARG")  # ARG X: no default
    assert args["TORCH_VARIANT"] == "cpu"
    install = next(ins.args for ins in instructions if ins.keyword == "RUN" and "TORCH_VARIANT" in ins.args)
    assert "cpu)" in install and "cuda)" in install and "exit 2" in install, "unknown variants must fail the build"
    apt = next(ins.args for ins in instructions if "apt-get install" in ins.args)
    for package in ("curl", "tini", "rsync", "openssh-client"):  # healthcheck, PID 1, cluster launcher
        assert f" {package}" in apt, package
    entrypoint = next(ins.args for ins in instructions if ins.keyword == "ENTRYPOINT")
    assert entrypoint == '["/usr/bin/tini", "--", "with-secrets.sh"]'


def test_dockerfile_copies_only_what_exists_in_the_build_context() -> None:
    copies = list(copy_instructions())
    assert copies
    for sources, _ in copies:
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file"
            assert not dockerignored(source), f"COPY {source}: .dockerignore leaves it out of the context"
    for secret_like in ("infra/secrets/postgres_password", ".git/config", ".venv/bin/python", "infra/.env"):
        assert dockerignored(secret_like), secret_like
    assert not dockerignored("infra/scripts/with-secrets.sh")


def _image_scripts() -> set[str]:
    return {Path(s).name for sources, dest in copy_instructions() if dest == "/usr/local/bin/" for s in sources}


def test_scripts_the_stack_runs_are_in_the_image() -> None:
    in_image = _image_scripts()
    commands = [
        command_words(svc.get("command")) for svc in load_compose()["services"].values() if is_our_image(svc["image"])
    ]
    commands += [
        command_words(c.get("args")) for pod in k8s_pods() for c in containers(pod) if is_our_image(c["image"])
    ]
    launcher = yaml.safe_load(LAUNCHER_FILE.read_text())
    commands += [
        shell_words(line) for line in launcher["head_start_ray_commands"] + launcher["worker_start_ray_commands"]
    ]
    used = {w for words in commands for w in words if w.endswith(".sh")}
    assert used == {"mlflow-server.sh", "layerlab-worker.sh", "with-secrets.sh"}
    assert used <= in_image, used - in_image
    for script in in_image:
        assert (SCRIPTS / script).stat().st_mode & 0o111, f"{script} is not executable"
