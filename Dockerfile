# Crucible in a container: the project and requirements.lock on the sandbox base image (Debian
# bookworm's Python 3.11), for the Docker run launcher and the Docker training step.
# Built by scripts/build-project-image, which gathers the wheels on the host first, so the build
# itself needs no network and no registry.
ARG BASE=crucible-sandbox:bookworm-2

FROM ${BASE}
# The wheels' layer stays in the image (~0.5 GB): a second stage to leave it behind would copy
# the 2 GB environment once more on every build, and the tests build this image.
COPY .cache/project-wheels /tmp/wheels
RUN python3 -m venv --without-pip /opt/crucible \
 && /opt/crucible/bin/python /tmp/wheels/pip.whl/pip install --quiet --disable-pip-version-check --no-index \
      --find-links /tmp/wheels -r /tmp/wheels/requirements.lock \
 && rm -rf /tmp/wheels
COPY pyproject.toml workspace.yaml /opt/crucible/src/
COPY assets /opt/crucible/src/assets
COPY commands /opt/crucible/src/commands
COPY datastore /opt/crucible/src/datastore
COPY environments /opt/crucible/src/environments
COPY grading /opt/crucible/src/grading
COPY pipelines /opt/crucible/src/pipelines
COPY sandbox /opt/crucible/src/sandbox
COPY statuses /opt/crucible/src/statuses
COPY task_sets /opt/crucible/src/task_sets
COPY training /opt/crucible/src/training
ENV PATH=/opt/crucible/bin:/usr/local/bin:/usr/bin:/bin PYTHONPATH=/opt/crucible/src PYTHONUNBUFFERED=1
WORKDIR /opt/crucible/src
