"""Which containers and pods are an experiment's training steps: a step whose run died without a
word is found by this label, and removed, before the experiment's next step starts."""

from __future__ import annotations

import hashlib

STEP_LABEL = "crucible.training-step"


def step_labels(experiment: str, checkpoints: str) -> dict[str, str]:
    """The label of an experiment's step containers or pods, whose checkpoints are in `checkpoints`
    (a host's folder, a pod's volume): another deployment's experiment of the same name, on a
    shared daemon or namespace, is not ours. Hashed into a valid Kubernetes label value."""
    return {STEP_LABEL: hashlib.sha256(f"{checkpoints}\n{experiment}".encode()).hexdigest()[:16]}
