"""The training step as a pod on Kubernetes, through Dagster's PipesK8sClient (dagster-k8s).

The operator describes the pod in a PodTemplate file (CRUCIBLE_TRAIN_POD_TEMPLATE; the
repository's is deploy/kubernetes/training-step.yaml): its namespace, the GPU nodes it goes to,
its resources and tolerations, the container's command (`torchrun --nproc-per-node 8 …` for a
node's GPUs), and a volume named `checkpoints`, a claim every run's pods share. Crucible fills in
what only the run knows:

- the image, when CRUCIBLE_TRAIN_IMAGE names one (else the template's), and the command, when the
  template's container has none (the crucible resource's launcher and the step's module);
- the `checkpoints` volume mounted at the run's checkpoint root (and CRUCIBLE_CHECKPOINT_ROOT
  set to it), so the training job names the same files in the pod as in the run;
- Dagster Pipes' bootstrap variables, and a label for the experiment (of the template's
  checkpoints volume, assets/training_label.py): a pod of it still there when its next step
  starts is one whose run died without a word, and is deleted (the run's service account needs
  list and deletecollection on pods).

Nothing else of the run's environment is copied into the pod, where anyone who may read pods
would read it: the S3 endpoint and credentials come from the template (a secret, `envFrom`).
The datasets must be on S3 (or another object store): a pod does not see this machine's disk.
Dagster's client reads the step's reports from the pod's log and waits for it to end.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import kubernetes
import yaml
from dagster import AssetExecutionContext, Failure, PipesClientCompletedInvocation
from dagster_k8s import PipesK8sClient
from dagster_k8s.utils import detect_current_namespace
from kubernetes.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION

from assets.resources import CrucibleResource
from assets.training_label import step_labels

CHECKPOINT_VOLUME = "checkpoints"  # the template's volume that holds the experiments' checkpoints
DELETE_WAIT_S = 120


class PodTemplateError(ValueError):
    """A pod template Crucible cannot run the training step from; the message says why."""


def load_template(path: str) -> dict:
    """The one PodTemplate in the file at `path`, checked for what Crucible needs of it."""
    try:
        documents = list(yaml.safe_load_all(Path(path).read_text()))
    except (OSError, yaml.YAMLError) as error:
        raise PodTemplateError(f"{path}: cannot read the pod template ({' '.join(str(error).split())})") from None
    templates = [doc for doc in documents if isinstance(doc, dict) and doc.get("kind") == "PodTemplate"]
    if len(templates) != 1:
        raise PodTemplateError(f"{path}: holds {len(templates)} PodTemplates (kind: PodTemplate, with template.spec), "
                               "not one")
    [document] = templates
    spec = (document.get("template") or {}).get("spec") or {}
    if len(spec.get("containers") or []) != 1:
        raise PodTemplateError(f"{path}: template.spec.containers must hold the one container that trains")
    if not any(volume.get("name") == CHECKPOINT_VOLUME for volume in spec.get("volumes") or []):
        raise PodTemplateError(f"{path}: template.spec.volumes has no volume named {CHECKPOINT_VOLUME!r} (the "
                               "claim that holds the checkpoints)")
    return document


def pod_spec(template: dict, crucible: CrucibleResource, image: str, command: list[str]) -> dict:
    """The template's pod spec with the run's image, command (unless the template has one) and
    checkpoint mount."""
    spec = copy.deepcopy(template["template"]["spec"])
    [container] = spec["containers"]
    if image:
        container["image"] = image
    container.setdefault("command", command)
    root = str(Path(crucible.checkpoint_root).resolve())
    mounts = [mount for mount in container.get("volumeMounts") or [] if mount.get("name") != CHECKPOINT_VOLUME]
    container["volumeMounts"] = [*mounts, {"name": CHECKPOINT_VOLUME, "mountPath": root}]
    kept = [variable for variable in container.get("env") or [] if variable.get("name") != "CRUCIBLE_CHECKPOINT_ROOT"]
    container["env"] = [*kept, {"name": "CRUCIBLE_CHECKPOINT_ROOT", "value": root}]
    return spec


def run_pod(context: AssetExecutionContext, crucible: CrucibleResource, template_path: str, image: str,
            command: list[str], experiment: str, extras: dict) -> PipesClientCompletedInvocation:
    """The experiment's training step in a pod of the template, followed to its end; the pods of
    the experiment's steps (of the template's checkpoints volume) left by a run that died are
    deleted first."""
    if "://" not in crucible.storage_root:
        raise Failure(f"the kubernetes training step reads the datasets from the pod, and the storage root "
                      f"{crucible.storage_root} is this machine's disk: put it on S3 (CRUCIBLE_STORAGE_ROOT=s3://…)",
                      allow_retries=False)
    try:
        template = load_template(template_path)
    except PodTemplateError as error:
        raise Failure(str(error), allow_retries=False) from None
    client = PipesK8sClient()
    try:
        client._load_k8s_config()  # the client's own loading, first: a sentence instead of a traceback
    except (kubernetes.config.ConfigException, OSError) as error:
        raise Failure(f"no Kubernetes cluster is configured here (KUBECONFIG, ~/.kube/config, or in a pod): "
                      f"{' '.join(str(error).split())}", allow_retries=False) from None
    namespace = (template.get("metadata") or {}).get("namespace") or _current_namespace()
    [volume] = [v for v in template["template"]["spec"]["volumes"] if v.get("name") == CHECKPOINT_VOLUME]
    labels = step_labels(experiment, json.dumps(volume, sort_keys=True))
    _delete_left_over(namespace, labels)
    template_labels = (template["template"].get("metadata") or {}).get("labels") or {}
    return client.run(context=context, extras=extras, namespace=namespace,
                      base_pod_meta={"labels": {**template_labels, **labels}},
                      base_pod_spec=pod_spec(template, crucible, image, command))


def _current_namespace() -> str:
    """The namespace this runs in (in a pod), else the kubeconfig's current context's, else default."""
    try:
        return detect_current_namespace(KUBE_CONFIG_DEFAULT_LOCATION) or "default"
    except (kubernetes.config.ConfigException, OSError):  # in a pod without the namespace file
        return "default"


def _delete_left_over(namespace: str, labels: dict[str, str]) -> None:
    """Delete the pods a dead run of the experiment left, and wait until they are gone: one still
    writing the checkpoint this step writes would race it."""
    selector = ",".join(f"{key}={value}" for key, value in labels.items())
    api = kubernetes.client.CoreV1Api()
    try:
        # The pods' own grace period: until their containers have stopped, they are still listed.
        api.delete_collection_namespaced_pod(namespace, label_selector=selector)
        deadline = time.monotonic() + DELETE_WAIT_S
        while api.list_namespaced_pod(namespace, label_selector=selector).items:
            if time.monotonic() > deadline:
                raise Failure(f"a training pod left by a dead run ({selector}) is still in namespace {namespace} "
                              f"after {DELETE_WAIT_S} s: delete it, then run the step again", allow_retries=False)
            time.sleep(2)
    except kubernetes.client.ApiException as error:
        raise Failure(f"Kubernetes refused to list or delete training pods ({selector}) in namespace {namespace}: "
                      f"{error.status} {error.reason} (the run's service account needs list and deletecollection "
                      "on pods)", allow_retries=False) from None
