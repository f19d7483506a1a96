"""Build an environment once, for the local backend or for Docker; a second build of the same
spec costs nothing (the store already has it).

- Python packages: pip, from the registries, run for the sandbox's own interpreter
  (`pip --python /usr/bin/python3 install --target <digest>/site-packages`), so compiled
  wheels match the interpreter the tests run under, on both backends.
- An environment that names its Python (`python_version`): a virtual environment of this
  host's interpreter of that version, its requirements and the repository's own set-up, built
  in a sandbox (environments/virtualenv.py); refused in one sentence where the host has no
  such interpreter. Its Docker image holds the interpreter at the same path as here.
- Debian packages: on Docker, installed into the image (`apt-get install` in a `docker build`
  from the sandbox base image); on the local backend, which runs on this host's /usr, they must
  already be installed here, and a build that lacks one says which.
- Docker: the image `crucible-env:<digest>` is `FROM` the base image, with the built tree
  copied to ENVIRONMENT_ROOT; it is labelled with its digest so `crucible env prune` finds it.
A failed build names what failed and the log line that says why, and leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath

from environments import interpreters
from environments.spec import RECIPE_VERSION, SITE_PACKAGES, WHEELS, EnvironmentSpec
from environments.store import Built, EnvironmentStore, image_tag
from environments.virtualenv import SetupError, build_virtualenv, pins
from sandbox.bwrap_exec import SANDBOX_PYTHON
from sandbox.spec import ENVIRONMENT_ROOT

PIP_TIMEOUT_S = 1800
DOCKER_BUILD_TIMEOUT_S = 1800
LABEL = "crucible.environment"
INTERPRETER_REPOSITORY = "crucible-python"
STORE_LABEL = "crucible.environment.store"  # prune removes only the images its own store built
RESOLUTIONS = "resolutions"  # under the store's root: each unlocked spec's locked spec
PIP_CACHE = ".pip-cache"  # under the store's root: wheels built once for every build of the store
Repositories = Mapping[str, Mapping[str, str | bytes]]  # EnvironmentSpec.repository -> its files
_PIP_ERROR = re.compile(r"^ERROR: (.*)$", re.M)
_PIP_REQUIREMENT = re.compile(r"the requirement ([^\s(]+)|found for ([^\s(]+)|[Cc]ould not build wheels for "
                              r"([\w.-]+)|\(([\w.-]+)\)\s*$")


class BuildError(RuntimeError):
    """The environment could not be built; the message names the package and the log line."""


def build(spec: EnvironmentSpec, store: EnvironmentStore, backend: str = "local",
          progress: Callable[[str], None] = lambda line: None, repositories: Repositories | None = None) -> Built:
    """The built environment of `spec` for `backend` ("local" or "docker"), building what is
    missing; `repositories` holds the files of the repository a `setup` runs in."""
    built = store.get(spec.digest) or _build_tree(spec, store, progress, repositories or {})
    if backend == "docker":
        _ensure_image(spec, built, store, progress)
    elif _missing_debian(spec.debian):
        raise BuildError(f"environment {spec.short} needs Debian package(s) {', '.join(_missing_debian(spec.debian))}, "
                         "which this host does not have: the local backend runs on the host's /usr (install them, "
                         "or use the Docker backend)")
    return built


def build_all(specs: Iterable[EnvironmentSpec], backend: str, store: EnvironmentStore,
              progress: Callable[[str], None] = lambda line: None, repositories: Repositories | None = None
              ) -> list[Built]:
    """Every distinct environment of `specs`, built for `backend` into `store` (nothing to do when all are)."""
    distinct = {spec.digest: spec for spec in specs}
    return [build(spec, store, backend, progress, repositories) for spec in distinct.values()]


def _build_tree(spec: EnvironmentSpec, store: EnvironmentStore, progress: Callable[[str], None],
                repositories: Repositories) -> Built:
    interpreter = _interpreter(spec)
    repository = _repository(spec, repositories)
    with store.building(spec.digest) as staging:
        done = store.get(spec.digest)  # built by another process while this one waited
        if done is not None:
            return done
        started = time.monotonic()
        if interpreter is not None:
            progress(f"environment {spec.short}: a virtual environment of Python {interpreter.version}")
            try:
                built = build_virtualenv(spec, interpreter, staging, repository, store.root / PIP_CACHE, progress)
            except SetupError as e:
                raise BuildError(f"environment {spec.short}: {e}") from None
            installed, wheels = [line.split("==")[0] for line in pins(built["locked"])], []
        else:
            built = {}
            installed = _pip_install(spec, staging / SITE_PACKAGES, progress) if spec.python else []
            wheels = _pip_download(spec, staging / WHEELS, progress) if spec.wheels else []
        _write_files(spec, staging)
        record = {"digest": spec.digest, "spec": spec.model_dump(mode="json"), "installed": installed,
                  "wheels": wheels, "built_at": time.time(), **built,
                  "build_s": round(time.monotonic() - started, 1)}
        progress(f"environment {spec.short}: built in {record['build_s']} s ({len(installed)} Python packages)")
        return store.publish(staging, spec.digest, record)


def locked(spec: EnvironmentSpec, store: EnvironmentStore, progress: Callable[[str], None] = lambda line: None,
           repositories: Repositories | None = None) -> EnvironmentSpec:
    """`spec` with `lock`: the exact pins its requirements and setup resolve to today, resolved
    once per spec and kept (<store>/resolutions/); the build that resolved them is the locked
    spec's build, so nothing is built twice. A spec without python_version, or locked already,
    is returned as it is."""
    if spec.lock or not spec.python_version:
        return spec
    resolution = store.root / RESOLUTIONS / f"{spec.digest}.json"
    if resolution.is_file():
        return EnvironmentSpec.model_validate_json(resolution.read_text())
    interpreter, repository = _interpreter(spec), _repository(spec, repositories or {})
    with store.building(spec.digest) as staging:
        if resolution.is_file():  # resolved by another process while this one waited
            return EnvironmentSpec.model_validate_json(resolution.read_text())
        started = time.monotonic()
        progress(f"environment {spec.short}: resolving its requirements in Python {interpreter.version}")
        try:
            built = build_virtualenv(spec, interpreter, staging, repository, store.root / PIP_CACHE, progress)
        except SetupError as e:
            raise BuildError(f"environment {spec.short}: {e}") from None
        result = spec.model_copy(update={"lock": pins(built["locked"])})
        _write_files(spec, staging)
        record = {"digest": result.digest, "spec": result.model_dump(mode="json"), "resolved_from": spec.digest,
                  "installed": [line.split("==")[0] for line in result.lock], "wheels": [], "built_at": time.time(),
                  **built, "build_s": round(time.monotonic() - started, 1)}
        with store.lock(result.digest):  # a build of the locked spec itself may be under way
            store.publish(staging, result.digest, record)
        resolution.parent.mkdir(parents=True, exist_ok=True)
        written = resolution.with_name(f"{resolution.name}.{os.getpid()}.tmp")
        written.write_text(result.model_dump_json())
        written.replace(resolution)
    progress(f"environment {spec.short}: locked to {len(result.lock)} pins as {result.short}")
    return result


def _write_files(spec: EnvironmentSpec, staging: Path) -> None:
    for name, text in spec.files.items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_text(text)


def _interpreter(spec: EnvironmentSpec) -> interpreters.Interpreter | None:
    if not spec.python_version:
        return None
    try:
        return interpreters.find(spec.python_version)
    except interpreters.NoInterpreter as e:
        raise BuildError(f"environment {spec.short} {e}") from None


def _repository(spec: EnvironmentSpec, repositories: Repositories) -> Mapping[str, str | bytes]:
    if not spec.repository:
        return {}
    if spec.repository not in repositories:
        raise BuildError(f"environment {spec.short} runs its setup in {spec.repository}, whose files the build was "
                         "not given (build it through its task set: crucible env build SET)")
    return repositories[spec.repository]


def _pip_install(spec: EnvironmentSpec, target: Path, progress: Callable[[str], None]) -> list[str]:
    progress(f"environment {spec.short}: pip install {len(spec.python)} requirement(s)")
    _pip(spec, spec.python, target.parent, "install", ["--no-warn-script-location", "--target", str(target)])
    return sorted(path.name.removesuffix(".dist-info") for path in target.glob("*.dist-info"))


def _pip_download(spec: EnvironmentSpec, target: Path, progress: Callable[[str], None]) -> list[str]:
    progress(f"environment {spec.short}: pip download {len(spec.wheels)} wheel requirement(s)")
    _pip(spec, spec.wheels, target.parent, "download", ["--only-binary=:all:", "--dest", str(target)])
    return sorted(path.name for path in target.glob("*.whl"))


def _pip(spec: EnvironmentSpec, lines: tuple[str, ...], scratch: Path, subcommand: str, options: list[str]) -> None:
    """pip `subcommand` of `lines`, for the sandbox's interpreter (its version and ABI)."""
    requirements = scratch / "requirements.txt"
    requirements.write_text("".join(f"{line}\n" for line in lines))
    command = [sys.executable, "-m", "pip", "--python", SANDBOX_PYTHON, subcommand, "--no-input",
               "--disable-pip-version-check", "--progress-bar", "off", *options, "-r", str(requirements)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BuildError(f"environment {spec.short}: pip took longer than {PIP_TIMEOUT_S} s") from None
    finally:
        requirements.unlink(missing_ok=True)
    if done.returncode != 0:
        raise BuildError(f"environment {spec.short}: {_pip_failure(done.stdout + done.stderr)}")


def _pip_failure(log: str) -> str:
    """The package pip could not install and its log line, e.g. "pip could not install
    numpy==9.9: Could not find a version that satisfies the requirement numpy==9.9"."""
    errors = [line for line in _PIP_ERROR.findall(log) if "pip's dependency resolver" not in line]
    if not errors:
        return f"pip failed: {(log.strip().splitlines() or ['(no output)'])[-1]}"
    found = next(filter(None, map(_PIP_REQUIREMENT.search, errors)), None)
    package = next(group for group in found.groups() if group) if found else None
    return f"pip could not install {package}: {errors[0]}" if package else f"pip failed: {errors[0]}"


def _missing_debian(packages: tuple[str, ...]) -> list[str]:
    if not packages:
        return []
    shown = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\n", *packages],
                           capture_output=True, text=True)
    installed = {line.split()[0] for line in shown.stdout.splitlines() if line.endswith(" installed")}
    return [name for name in packages if name not in installed]


# -- Docker ---------------------------------------------------------------------------------


def _ensure_image(spec: EnvironmentSpec, built: Built, store: EnvironmentStore, progress: Callable[[str], None]) -> str:
    import docker  # only here: the local backend needs no docker SDK

    client = docker.from_env(timeout=DOCKER_BUILD_TIMEOUT_S)
    tag = image_tag(spec.digest)
    try:
        return client.images.get(tag).id
    except docker.errors.ImageNotFound:
        pass
    base = _task_image(client, spec, progress) if spec.dockerfile else _sandbox_base(client)
    prefix = built.interpreter_prefix
    if prefix and prefix != "/usr":  # /usr: Debian's own python3, which the base image has at the same place
        base = _interpreter_image(client, spec, base, prefix, progress)
    progress(f"environment {spec.short}: docker build {tag}")
    return _docker_build(client, spec, _context(_dockerfile(base, spec), {"tree": built.path}),
                         labels={LABEL: spec.digest, STORE_LABEL: str(store.root)}, tag=tag)


def _interpreter_image(client, spec: EnvironmentSpec, base: str, prefix: str, progress: Callable[[str], None]) -> str:
    """`base` with this host's interpreter at `prefix`, the path a virtual environment's links
    and the interpreter's RUNPATH name; built once per base and interpreter, shared by every
    environment of that Python (its ~200 MB are sent to the daemon once)."""
    import docker

    tag = f"{INTERPRETER_REPOSITORY}:{hashlib.sha256(f'{base} {prefix} {RECIPE_VERSION}'.encode()).hexdigest()[:16]}"
    try:
        return client.images.get(tag).id
    except docker.errors.ImageNotFound:
        pass
    parents = " ".join(str(p) for p in PurePosixPath(prefix).parents[:-1])
    dockerfile = f"FROM {base}\nCOPY python {prefix}\nRUN chmod o+rx {parents}\n"  # /root is 0700 in the base
    progress(f"environment {spec.short}: docker build {tag} (the interpreter at {prefix})")
    return _docker_build(client, spec, _context(dockerfile, {"python": Path(prefix)}), tag=tag)


def _sandbox_base(client) -> str:
    import docker

    from sandbox.docker import DEFAULT_IMAGE

    try:
        return client.images.get(DEFAULT_IMAGE).id
    except docker.errors.ImageNotFound:
        raise BuildError(f"no base image {DEFAULT_IMAGE!r}; build it with scripts/build-sandbox-image") from None


def _task_image(client, spec: EnvironmentSpec, progress: Callable[[str], None]) -> str:
    """The image of the task's own Dockerfile, whose bases must be on this daemon (a sandbox
    host reaches no registry, and a pull would not be reproducible)."""
    import docker

    stages = set()
    for line in spec.dockerfile.splitlines():
        words = line.split()
        if len(words) < 2 or words[0].upper() != "FROM":
            continue
        base = next((w for w in words[1:] if not w.startswith("--")), "scratch")
        if base not in stages and base != "scratch":
            try:
                client.images.get(base)
            except docker.errors.ImageNotFound:
                raise BuildError(f"environment {spec.short}: the task's Dockerfile is FROM {base}, which this Docker "
                                 "daemon does not have: load it (docker load, or docker pull where a registry can be "
                                 "reached), or use the local backend") from None
        if len(words) >= 4 and words[-2].upper() == "AS":
            stages.add(words[-1])
    progress(f"environment {spec.short}: docker build of the task's Dockerfile")
    return _docker_build(client, spec, _context(spec.dockerfile, dict(spec.context)))


def _docker_build(client, spec: EnvironmentSpec, context: io.BytesIO, **options) -> str:
    import docker

    try:
        image, _ = client.images.build(fileobj=context, custom_context=True, network_mode="host", rm=True,
                                       forcerm=True, **options)
    except docker.errors.BuildError as e:
        lines = [str(chunk.get("stream") or chunk.get("error") or "").strip() for chunk in e.build_log]
        failing = next((line for line in reversed(lines) if re.search(r"E: |[Ee]rror|Unable to locate", line)),
                       str(e))
        raise BuildError(f"environment {spec.short}: docker build failed: {failing}") from None
    except docker.errors.APIError as e:
        raise BuildError(f"environment {spec.short}: docker build failed: {e.explanation or e}") from None
    return image.id


def _dockerfile(base: str, spec: EnvironmentSpec) -> str:
    lines = [f"FROM {base}", f"COPY tree {ENVIRONMENT_ROOT}"]  # modes as published: readable by all
    if spec.debian:
        lines.append("RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                     f"--no-install-recommends {' '.join(spec.debian)} && rm -rf /var/lib/apt/lists/*")
    return "\n".join(lines) + "\n"


def _context(dockerfile: str, entries: dict[str, Path | str]) -> io.BytesIO:
    """A build context, as a tar in memory: the Dockerfile, and each entry a directory (a Path)
    or a file's text. An interpreter's own tests and site-packages stay out: a virtual
    environment uses neither."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, content in {"Dockerfile": dockerfile, **entries}.items():
            if isinstance(content, Path):
                tar.add(content, arcname=name, filter=_without_interpreter_extras)
                continue
            data = content.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def _without_interpreter_extras(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = PurePosixPath(member.name).parts
    if parts[0] == "python" and len(parts) > 3 and parts[1] == "lib" and parts[3] in ("test", "site-packages"):
        return None
    return member


def remove_image(digest: str) -> bool:
    import docker

    client = docker.from_env()
    try:
        client.images.remove(image_tag(digest), force=True)
    except docker.errors.ImageNotFound:
        return False
    return True


def images(store: EnvironmentStore) -> dict[str, str]:
    """Docker images `store`'s builds made on this daemon: digest -> image id ({} without Docker)."""
    try:
        import docker
    except ImportError:
        return {}
    try:
        client = docker.from_env(timeout=10)
        found = client.images.list(filters={"label": f"{STORE_LABEL}={store.root}"})
        return {image.labels[LABEL]: image.id for image in found}
    except docker.errors.DockerException:  # no daemon: no images to list
        return {}

