"""infra/k8s against Kubernetes' own OpenAPI schemas, offline: kubernetes-validate ships the JSON schemas of
every Kubernetes release (no cluster, no download), the check `kubeconform -strict` makes. Strict: a field the
API does not know (a typo, a field from another kind) fails, as `kubectl apply --validate=strict` would.

RayCluster is KubeRay's custom resource, whose schema is not among Kubernetes' own: its pod templates (head and
worker groups) are validated as core/v1 PodTemplates instead, and test_infra_wiring checks the rest."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from tests.infra.deploy_files import k8s_docs

# The oldest Kubernetes release still in upstream support when this was written, and the newest the schemas know:
# a manifest valid on both is valid on the releases between (fields are not removed within v1).
VERSIONS = ("1.33.0", kubernetes_validate.latest_version())


def _pod_templates(raycluster: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    spec = raycluster["spec"]
    groups = [("head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec.get("workerGroupSpecs", [])]
    return [
        (name, {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": g["template"]})
        for name, g in groups
    ]


def _objects() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for file, doc in k8s_docs():
        if doc["kind"] == "RayCluster":
            out += [(f"{file}:{doc['metadata']['name']}/{name}", tpl) for name, tpl in _pod_templates(doc)]
        else:
            out.append((f"{file}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_for_kubernetes(version: str) -> None:
    failures = []
    for where, obj in _objects():
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{where}: {exc.message} at {'/'.join(map(str, exc.path))}")
    assert not failures, "\n".join(failures)


def test_the_raycluster_pod_templates_are_among_the_objects_checked() -> None:
    names = [where for where, _ in _objects()]
    assert any("/head" in n for n in names) and len([n for n in names if "raycluster.yaml" in n]) >= 2, names


def test_the_check_refuses_an_unknown_field_and_a_wrong_type() -> None:
    """The validator is not a rubber stamp: a typo in a Deployment, and a string where a number goes, fail."""
    deployment = copy.deepcopy(next(doc for _, doc in k8s_docs() if doc["kind"] == "Deployment"))
    typo = copy.deepcopy(deployment)
    typo["spec"]["replcas"] = typo["spec"].pop("replicas", 1)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, VERSIONS[0], strict=True)
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": "http"}]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong_type, VERSIONS[0], strict=True)
