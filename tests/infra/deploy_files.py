"""Readers for the deployment files (Dockerfile, infra/): what a Docker engine, Compose, kubectl and
KubeRay would make of them, as far as the wiring tests need. No engine or cluster runs here."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
SCRIPTS = INFRA / "scripts"
COMPOSE_FILE = INFRA / "docker-compose.yml"
K8S = INFRA / "k8s"
LAUNCHER_FILE = INFRA / "ray-cluster.yaml"
LAUNCHER_ENV = INFRA / "launcher.env.example"
DOCS = ROOT / "docs" / "run-on-a-cluster.md"
OUR_IMAGE_REPO = "layerlab"

# --- Compose ----------------------------------------------------------------------------------

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])((?:[^{}]|\{[^{}]*\})*))?\}|\$\$")


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's variable syntax: ${X}, ${X:-default}, ${X-default}, ${X:?error}, ${X?error}, $$."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group(1), m.group(2), m.group(3) or ""
        is_set, is_empty = name in env, not env.get(name)
        if op in (":-", "-"):
            use_default = is_empty if op == ":-" else not is_set
            return interpolate(arg, env) if use_default else env[name]
        if op in (":?", "?"):
            if is_empty if op == ":?" else not is_set:
                raise ValueError(f"${{{name}}} is required: {arg}")
            return env[name]
        return env.get(name, "")

    return _VAR.sub(one, value)


def _interpolate_tree(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_interpolate_tree(x, env) for x in node]
    if isinstance(node, dict):
        return {k: _interpolate_tree(v, env) for k, v in node.items()}
    return node


def load_compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The compose file as `docker compose config` would see it with only `env` set (YAML merge keys
    are resolved by the YAML loader)."""
    return _interpolate_tree(yaml.safe_load(COMPOSE_FILE.read_text()), env or {})  # type: ignore[no-any-return]


def service_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def command_words(command: Any) -> list[str]:
    if command is None:
        return []
    return shlex.split(command) if isinstance(command, str) else [str(w) for w in command]


def is_our_image(image: str) -> bool:
    repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    return repo.rsplit("/", 1)[-1] == OUR_IMAGE_REPO


def image_repo(image: str) -> str:
    """quay.io/minio/minio:RELEASE... -> minio; postgres:17-bookworm -> postgres."""
    name = image.rsplit("/", 1)[-1]
    return name.split(":", 1)[0].split("@", 1)[0]


# --- Kubernetes -------------------------------------------------------------------------------


@cache
def k8s_docs() -> tuple[tuple[str, dict[str, Any]], ...]:
    """(file name, object) for every object in infra/k8s (the Kustomization itself left out)."""
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") != "Kustomization":
                docs.append((path.name, doc))
    return tuple(docs)


@dataclass(frozen=True)
class Pod:
    """A pod template: who owns it, its labels and spec."""

    owner: str
    labels: dict[str, str]
    spec: dict[str, Any]
    ray_node_type: str | None = None  # "head" | "worker" for RayCluster pods
    ray_start_params: dict[str, str] | None = None
    claim_volumes: frozenset[str] = frozenset()  # a StatefulSet's volumeClaimTemplates


def k8s_pods(objects: tuple[tuple[str, dict[str, Any]], ...] | None = None) -> Iterator[Pod]:
    for _, obj in objects or k8s_docs():
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind in ("Deployment", "StatefulSet", "Job"):
            template = obj["spec"]["template"]
            claims = frozenset(c["metadata"]["name"] for c in obj["spec"].get("volumeClaimTemplates", []))
            yield Pod(f"{kind}/{name}", template["metadata"].get("labels", {}), template["spec"], claim_volumes=claims)
        elif kind == "RayCluster":
            head = obj["spec"]["headGroupSpec"]
            yield Pod(
                f"RayCluster/{name}/head",
                head["template"]["metadata"].get("labels", {}),
                head["template"]["spec"],
                "head",
                head.get("rayStartParams", {}),
            )
            for group in obj["spec"].get("workerGroupSpecs", []):
                template = group["template"]
                yield Pod(
                    f"RayCluster/{name}/{group['groupName']}",
                    template["metadata"].get("labels", {}),
                    template["spec"],
                    "worker",
                    group.get("rayStartParams", {}),
                )


def containers(pod: Pod) -> list[dict[str, Any]]:
    return [*pod.spec.get("initContainers", []), *pod.spec["containers"]]


@dataclass(frozen=True)
class Service:
    name: str
    type: str
    ports: dict[int, str | int]  # port -> targetPort
    selector: dict[str, str]
    owner_pod: str | None = None  # for the head Service KubeRay creates


# KubeRay adds this port to the head Service whatever the head container declares.
KUBERAY_METRICS_PORT = 8080


def k8s_services(objects: tuple[tuple[str, dict[str, Any]], ...] | None = None) -> dict[str, Service]:
    """Services in the manifests, plus the head Service KubeRay creates for each RayCluster (named by
    headService.metadata.name, or `<cluster>-head-svc`; its ports are the head container's ports)."""
    services: dict[str, Service] = {}
    for _, obj in objects or k8s_docs():
        if obj["kind"] == "Service":
            spec = obj["spec"]
            ports = {p["port"]: p.get("targetPort", p["port"]) for p in spec.get("ports", [])}
            name = obj["metadata"]["name"]
            services[name] = Service(name, spec.get("type", "ClusterIP"), ports, spec.get("selector", {}))
        elif obj["kind"] == "RayCluster":
            head = obj["spec"]["headGroupSpec"]
            name = ((head.get("headService") or {}).get("metadata") or {}).get("name") or (
                f"{obj['metadata']['name']}-head-svc"
            )
            ray_container = head["template"]["spec"]["containers"][0]
            ports: dict[int, str | int] = {
                p["containerPort"]: p["containerPort"] for p in ray_container.get("ports", [])
            }
            ports[KUBERAY_METRICS_PORT] = KUBERAY_METRICS_PORT
            owner = f"RayCluster/{obj['metadata']['name']}/head"
            services[name] = Service(name, head.get("serviceType", "ClusterIP"), ports, {}, owner)
    return services


def k8s_service_for_host(host: str, namespace: str = "layerlab") -> str | None:
    """The Service a host name resolves to inside the namespace: `svc`, `svc.ns`, `svc.ns.svc[.cluster.local]`."""
    parts = host.split(".")
    if len(parts) == 1:
        return parts[0]
    if parts[1] == namespace and parts[2:] in ([], ["svc"], ["svc", "cluster", "local"]):
        return parts[0]
    return None


# --- addresses in environment values and command lines ----------------------------------------

DEFAULT_PORTS = {"http": 80, "https": 443, "postgresql": 5432}


@dataclass(frozen=True)
class Address:
    host: str
    port: int
    where: str  # for messages: the variable or flag it came from


def addresses_in(name: str, value: str) -> list[Address]:
    """Network addresses a value points at: URLs (but s3:// names a bucket, not a host) and the bare
    host:port of *_ADDRESS variables and --address flags."""
    found = []
    if "://" in value and "," not in value:
        url = urlsplit(value)
        scheme = url.scheme.split("+", 1)[0]
        if scheme in DEFAULT_PORTS and url.hostname:
            found.append(Address(url.hostname, url.port or DEFAULT_PORTS[scheme], name))
    elif name.endswith("ADDRESS") or name == "--address":
        m = re.fullmatch(r"([A-Za-z0-9.-]+):(\d+)", value)
        if m:
            found.append(Address(m.group(1), int(m.group(2)), name))
    return found


def flag_value(words: list[str], flag: str) -> str | None:
    """`--flag=value` or `--flag value` in a command line."""
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def ray_start_commands(words: list[str]) -> Iterator[list[str]]:
    """The `ray start ...` invocations inside a command line (shell text split into words)."""
    for args in invocations(words, "ray"):
        if args[:1] == ["start"]:
            yield ["ray", *args]


_SEPARATORS = {";", "&&", "||", "&", "|"}
# Words after which the next word is again a command: `exec layerlab worker`, `-- layerlab token ...`,
# `then ray start ...`
_WRAPPERS = {"exec", "nohup", "--", "with-secrets.sh", "env", "time", "if", "then", "else", "do", "while", "!"}


def invocations(words: list[str], program: str) -> Iterator[list[str]]:
    """The arguments of each invocation of `program` in command position (first word, after a
    separator, an `exec`/`nohup`/`--`/`with-secrets.sh` wrapper or VAR=value assignments)."""
    at_command = True
    for i, word in enumerate(words):
        if at_command and word == program:
            rest = words[i + 1 :]
            yield rest[: next((j for j, w in enumerate(rest) if w in _SEPARATORS), len(rest))]
        if word in _SEPARATORS or word in _WRAPPERS:
            at_command = True
        elif at_command and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word):
            at_command = True
        else:
            at_command = False


def shell_words(text: str) -> list[str]:
    """Split shell text into words; ; && || & | and line ends become separator words of their own."""
    text = text.replace("\\\n", " ").replace("\n", "\n;")
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


# --- Dockerfile and .dockerignore -------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


@cache
def dockerfile() -> tuple[Instruction, ...]:
    lines, current = [], ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    out = []
    for line in lines:
        keyword, _, args = line.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip()))
    return tuple(out)


def copy_instructions() -> Iterator[tuple[list[str], str]]:
    """(sources, destination) of each COPY from the build context (COPY --from=... left out)."""
    for ins in dockerfile():
        if ins.keyword != "COPY":
            continue
        words = shlex.split(ins.args)
        if any(w.startswith("--from") for w in words):
            continue
        words = [w for w in words if not w.startswith("--")]
        yield words[:-1], words[-1]


def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out)


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps `path` (relative to the context) out of the build context: the
    last matching pattern wins, and a path is out when it or a parent folder is."""
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negate = line.startswith("!")
            rules.append((negate, _dockerignore_regex(line.lstrip("!").strip("/"))))
    parts = path.strip("/").split("/")
    for n in range(1, len(parts) + 1):
        prefix = "/".join(parts[:n])
        verdict = False
        for negate, regex in rules:
            if regex.fullmatch(prefix):
                verdict = not negate
        if verdict:
            return True
    return False
