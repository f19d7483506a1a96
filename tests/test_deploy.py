"""deploy/, checked offline (no cluster here): the Kubernetes manifests against Kubernetes' own
schemas (kubernetes-validate, strict: a misspelt field is an error), the Dagster chart's values
against the chart's schema (tests/data/dagster-helm/), and both against what the code does."""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

ROOT = Path(__file__).parent.parent
DEPLOY = ROOT / "deploy"
CHART = Path(__file__).parent / "data" / "dagster-helm"
KUBERNETES_VERSIONS = ("1.27.0", "1.33.0")  # the oldest and a recent release the manifests must suit
# The chart's schema refers to the Kubernetes definitions of v1.18 by URL; the same definitions
# of a supported release, offline.
K8S_DEFINITIONS = "https://kubernetesjsonschema.dev/v1.18.0/_definitions.json"
LOCAL_DEFINITIONS = "kubernetes-json-schema/v1.30.0-local/_definitions.json"


def manifests() -> list[tuple[str, dict]]:
    return [(f"{path.name}: {doc['kind']} {doc['metadata']['name']}", doc)
            for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_kubernetes(version):
    problems = []
    for name, doc in manifests():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{name}: {e.message} at {'.'.join(map(str, e.path))}")
    assert problems == []


def test_the_check_refuses_a_misspelt_field():
    name, pod = next((name, doc) for name, doc in manifests() if doc["metadata"]["name"] == "sandbox-session")
    misspelt = copy.deepcopy(pod)
    misspelt["template"]["spec"]["runtimeClasName"] = misspelt["template"]["spec"].pop("runtimeClassName")
    with pytest.raises(kubernetes_validate.ValidationError, match="runtimeClasName"):
        kubernetes_validate.validate(misspelt, KUBERNETES_VERSIONS[0], strict=True)


def test_sandbox_pods_keep_the_sandbox_contract():
    by_kind = {doc["kind"]: doc for _, doc in manifests() if doc["metadata"].get("namespace", "") in
               ("crucible-sandbox", "") and doc["kind"] != "Namespace"}
    spec = by_kind["PodTemplate"]["template"]["spec"]
    [container] = spec["containers"]
    assert (spec["runtimeClassName"], by_kind["RuntimeClass"]["metadata"]["name"]) == ("gvisor", "gvisor")
    assert spec["automountServiceAccountToken"] is False and not spec["hostNetwork"]
    assert (spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsNonRoot"]) == (65534, True)
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "privileged": False, "capabilities": {"drop": ["ALL"]}}
    assert container["resources"]["limits"]["memory"] == "512Mi"  # SandboxSpec's default limit
    deny = by_kind["NetworkPolicy"]["spec"]  # every pod of the namespace, both ways, no rule allowing any
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


def helm_merge(defaults: dict, values: dict) -> dict:
    """Helm's coalescing of an install's values over a chart's: maps merge, anything else replaces."""
    merged = dict(defaults)
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = helm_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


@pytest.fixture(scope="module")
def chart_validator():
    definitions = json.loads((resources.files("kubernetes_validate") / LOCAL_DEFINITIONS).read_text())
    # Served under the chart's URL: its refs name "definitions", the file's own "$defs"; and
    # without the file's $id, its refs resolve inside it.
    contents = {"definitions": definitions["$defs"], "$defs": definitions["$defs"]}
    registry = Registry().with_resource(K8S_DEFINITIONS, Resource.from_contents(contents, default_specification=DRAFT7))
    schema = json.loads((CHART / "values.schema.json").read_text())
    return jsonschema.Draft7Validator(schema, registry=registry)


def our_values() -> dict:
    return yaml.safe_load((DEPLOY / "helm" / "dagster-values.yaml").read_text())


def test_the_dagster_values_pass_the_charts_schema(chart_validator):
    merged = helm_merge(yaml.safe_load((CHART / "values.yaml").read_text()), our_values())
    problems = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in chart_validator.iter_errors(merged)]
    assert problems == []


def test_the_charts_schema_refuses_a_misspelt_launcher_setting(chart_validator):
    values = our_values()
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    launcher["envSecret"] = launcher.pop("envSecrets")
    merged = helm_merge(yaml.safe_load((CHART / "values.yaml").read_text()), values)
    assert any("envSecret" in e.message for e in chart_validator.iter_errors(merged))


def test_the_cluster_instance_enforces_what_the_local_one_does():
    local = yaml.safe_load((ROOT / "pipelines" / "dagster.yaml").read_text())
    values = our_values()
    daemon, instance = values["dagsterDaemon"], values["additionalInstanceConfig"]
    assert instance["concurrency"]["runs"]["tag_concurrency_limits"] == local["concurrency"]["runs"]["tag_concurrency_limits"]
    assert instance["concurrency"]["pools"] == local["concurrency"]["pools"]
    coordinator = daemon["runCoordinator"]["config"]["customRunCoordinator"]  # the lanes the limits count
    assert (coordinator["module"], coordinator["class"]) == (local["run_coordinator"]["module"],
                                                             local["run_coordinator"]["class"])
    assert (daemon["runRetries"]["maxRetries"], daemon["runRetries"]["retryOnAssetOrOpFailure"]) == (
        local["run_retries"]["max_retries"], local["run_retries"]["retry_on_asset_or_op_failure"])
    assert (daemon["runMonitoring"]["maxRuntimeSeconds"], daemon["runMonitoring"]["freeSlotsAfterRunEndSeconds"]) == (
        local["run_monitoring"]["max_runtime_seconds"], local["run_monitoring"]["free_slots_after_run_end_seconds"])
    [location] = values["dagster-user-deployments"]["deployments"]
    workspace = yaml.safe_load((ROOT / "workspace.yaml").read_text())
    assert location["dagsterApiGrpcArgs"] == ["--module-name", workspace["load_from"][0]["python_module"]["module_name"]]


TRAINING_TEMPLATE = DEPLOY / "kubernetes" / "training-step.yaml"


def training_pod(tmp_path, template_path: Path = TRAINING_TEMPLATE, **settings) -> dict:
    """The pod PipesK8sClient would create for a training step from deploy's template, as the API
    server would receive it (with Pipes' bootstrap variables)."""
    from dagster_k8s.pipes import build_pod_body
    from kubernetes.client import ApiClient

    from assets.resources import CrucibleResource
    from assets.training_label import step_labels
    from assets.training_pod import load_template, pod_spec
    from assets.training_step import TrainingStepClient

    crucible = CrucibleResource(storage_root="s3://crucible/data", checkpoint_root=str(tmp_path / "checkpoints"),
                                **settings)
    template = load_template(str(template_path))
    spec = pod_spec(template, crucible, "registry.example/crucible-project:0123abcd",
                    TrainingStepClient.step_command(crucible))
    body = build_pod_body(pod_name="dagster-pipes-checkpoint-0123", image=None, command=None,
                          env_vars={"DAGSTER_PIPES_CONTEXT": "e30=", "DAGSTER_PIPES_MESSAGES": "e30="},
                          base_pod_meta={"labels": {**template["template"]["metadata"]["labels"],
                                                    **step_labels("repair-" * 20, "checkpoints")}}, base_pod_spec=spec)
    return ApiClient().sanitize_for_serialization(body) | {"apiVersion": "v1", "kind": "Pod"}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_training_pod_crucible_builds_from_the_template_is_valid_kubernetes(tmp_path, version):
    kubernetes_validate.validate(training_pod(tmp_path), version, strict=True)


def test_the_training_pod_mounts_the_checkpoints_where_the_run_names_them_and_keeps_the_run_environment_out(tmp_path):
    [container] = training_pod(tmp_path)["spec"]["containers"]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    variables = {variable["name"]: variable["value"] for variable in container["env"]}
    assert mounts["checkpoints"] == str(tmp_path / "checkpoints") and mounts["shm"] == "/dev/shm"
    assert variables["CRUCIBLE_CHECKPOINT_ROOT"] == str(tmp_path / "checkpoints")
    assert variables.keys() == {"CRUCIBLE_CHECKPOINT_ROOT", "DAGSTER_PIPES_CONTEXT", "DAGSTER_PIPES_MESSAGES"}
    assert container["envFrom"] == [{"secretRef": {"name": "crucible-storage"}}]  # S3 from the cluster's secret
    assert container["image"] == "registry.example/crucible-project:0123abcd"
    assert container["command"][:4] == ["torchrun", "--standalone", "--nproc-per-node", "8"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_a_template_without_a_command_runs_the_step_under_the_launcher(tmp_path):
    document = yaml.safe_load(TRAINING_TEMPLATE.read_text())
    del document["template"]["spec"]["containers"][0]["command"]
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(document))
    [container] = training_pod(tmp_path, tmp_path / "pod.yaml",
                               train_launcher="torchrun --standalone --nproc-per-node 2")["spec"]["containers"]
    assert container["command"] == ["torchrun", "--standalone", "--nproc-per-node", "2", "-m", "assets.train_process"]


@pytest.mark.parametrize("edit, refusal", [
    (lambda doc: doc["template"]["spec"].pop("volumes"), "no volume named 'checkpoints'"),
    (lambda doc: doc.update(kind="Pod"), "holds 0 PodTemplates"),
])
def test_a_template_crucible_cannot_train_from_is_refused_in_one_sentence(tmp_path, edit, refusal):
    from assets.training_pod import PodTemplateError, load_template

    document = yaml.safe_load(TRAINING_TEMPLATE.read_text())
    edit(document)
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(document))
    with pytest.raises(PodTemplateError, match=refusal):
        load_template(str(tmp_path / "pod.yaml"))


@pytest.mark.parametrize("storage, refusal", [
    ("s3://crucible/data", "no Kubernetes cluster is configured here"),
    ("/srv/crucible/data", "the storage root /srv/crucible/data is this machine's disk: put it on S3"),
])
def test_a_kubernetes_step_that_cannot_start_fails_in_one_sentence(tmp_path, monkeypatch, storage, refusal):
    from dagster import Failure

    from assets.resources import CrucibleResource
    from assets.training_pod import run_pod

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    crucible = CrucibleResource(storage_root=storage, checkpoint_root=str(tmp_path / "checkpoints"))
    with pytest.raises(Failure, match=refusal) as failure:
        run_pod(None, crucible, str(TRAINING_TEMPLATE), "", ["python"], "repair", extras={})
    assert "\n" not in failure.value.description


# The project image (Dockerfile) installs requirements.lock into the Python of Debian bookworm,
# the sandbox base image's release (scripts/build-sandbox-image), not into the Python of this venv.
IMAGE_PYTHON = "3.11.2"


@pytest.mark.unit
def test_every_locked_package_installs_on_the_project_images_python():
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    refused = []
    for line in ROOT.joinpath("requirements.lock").read_text().splitlines():
        name, _, version = line.partition("==")
        try:
            installed = distribution(name)
        except PackageNotFoundError:  # a platform's package this venv did not install
            continue
        # A local label (torch's +cpu) names the build, not the release the lock pins.
        assert Version(installed.version).public == Version(version).public, \
            f"{name}: {installed.version} installed, {version} locked (make setup)"
        requires = installed.metadata.get("Requires-Python")
        if requires and not SpecifierSet(requires).contains(IMAGE_PYTHON):
            refused.append(f"{name}=={version} requires Python {requires}")
    assert not refused, refused
