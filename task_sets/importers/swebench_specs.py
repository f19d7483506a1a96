"""SWE-bench task environments derived from SWE-bench's published specification table.

The table (swebench_specs.json, written by scripts/swebench-specs from the swebench wheel on
PyPI) gives, per repository and version, the Python, the packages (a conda list, or
"requirements.txt" / "environment.yml": the repository's own file, at the paths the table
names), `pip_packages`, `pre_install` and `install` commands, `eval_commands` and `test_cmd`.
`derive` turns one entry and the repository's files into an EnvironmentSpec's fields and the test
command, or refuses (SpecRefused) in one sentence.

SWE-bench builds a conda environment: the packages, then `pip install <pip_packages>`, then in
the repository its `pre_install` commands as root and its `install`; before each test run it
sources `eval_commands` and runs `install` again. The translation:
- python_version is the spec's `python`; requirement lines are the packages' (a conda list's
  items as PyPI requirements: conda's `name=1.2` is `name==1.2.*`, as conda matches it; a
  requirements file with its `-r` includes followed, comments and the repository's own install
  line (`-e .`, `.[test]`) left out, SWE-bench's replacements of yanked packages applied; an
  environment.yml's conda dependencies likewise and its `pip:` list as it is), then
  `pip_packages`, which win where they pin a package the first set also names, since SWE-bench
  installs them afterwards;
- `pre_install`: `apt-get install` becomes Debian packages (`update`, `upgrade` dropped); steps
  that need root beyond apt (locale-gen, writing /etc) are left out with a note; the others
  (sed on the repository's files, downloads) run as setup steps before the install, in order,
  with /testbed (SWE-bench's checkout) read as the repository; a tool of SWE-bench's base image
  they call (wget, curl, git, jq) becomes a Debian package;
- `install` is the last setup step. Crucible installs once, at build time, so a non-editable
  install (`pip install .`, `setup.py install`) becomes editable: the tests must see the
  workspace, which SWE-bench gets by reinstalling before the tests;
- `export K=V` of `eval_commands` becomes env; its other commands are left out with a note;
- only pytest runs are accepted (`pytest ...`, `python -m pytest ...`).
Where a translation is approximate, `Derived.notes` says so, one line each.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from pydantic import ValidationError

from environments.spec import RESERVED_ENV, EnvironmentSpec

SPECS = Path(__file__).with_name("swebench_specs.json")
KNOWN_FIELDS = {"python", "packages", "pip_packages", "pre_install", "install", "eval_commands", "test_cmd",
                "no_use_env", "execute_test_as_nonroot", "nano_cpus"}
TESTBED = re.compile(r"/testbed(?=/|[\s\"';&|]|$)")  # SWE-bench's checkout of the repository
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.S)
NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)")
SPECIFIER = re.compile(r"\s*(\[[^\]]*\])?\s*(==|!=|<=|>=|~=|===|<|>|@)")
SELF_INSTALL = re.compile(r"""(?:(?:-e|--editable)(?:\s+|=))?(['"]?)\.(?:/)?(?:\[[^\]]*\])?\1""")
COMMENT = re.compile(r"(^|\s+)#.*$")
# Tools SWE-bench's base image (Ubuntu, swebench/harness/dockerfiles/python.py) has and the
# sandbox image may lack, as Debian packages, for setup steps that call them.
BASE_IMAGE_TOOLS = {"wget": "wget", "curl": "curl", "git": "git", "jq": "jq"}
ROOT_COMMANDS = {"locale-gen", "update-locale", "dpkg-reconfigure", "ldconfig", "sudo", "useradd", "adduser",
                 "apt-key"}
APT_DROPPED = {"update", "upgrade", "dist-upgrade", "full-upgrade", "clean", "autoremove"}
# Conda packages under another name on PyPI (conda name -> PyPI name).
CONDA_TO_PYPI = {
    "matplotlib-base": "matplotlib", "dask-core": "dask", "pyqt": "PyQt5", "pytables": "tables",
    "iris": "scitools-iris", "pytorch": "torch", "msgpack-python": "msgpack", "python-graphviz": "graphviz",
    "py-opencv": "opencv-python", "libopencv": "opencv-python",
}
# Conda packages with no PyPI equivalent an environment.yml could be translated into.
CONDA_WITHOUT_PYPI = {
    **dict.fromkeys(("hdf5", "libnetcdf", "netcdf-fortran", "proj", "geos", "gdal", "libgdal", "mesalib",
                     "openblas", "mkl", "blas", "libblas", "liblapack", "zlib", "libffi", "cairo"), "a C library"),
    **dict.fromkeys(("c-compiler", "cxx-compiler", "fortran-compiler", "compilers", "gcc", "gxx", "gfortran",
                     "make", "ccache", "pkg-config"), "a build tool"),
    **dict.fromkeys(("gtk3", "gtk4", "qt", "qt-main", "tk"), "a GUI toolkit's libraries"),
    "graphviz": "the Graphviz programs (PyPI's graphviz is their Python binding)",
    "ffmpeg": "a program", "imagemagick": "a program", "ghostscript": "a program", "nodejs": "a program",
    "pygobject": "a binding PyPI has only as source, built against system GTK libraries",
    "wxpython": "a binding PyPI has only as source for Linux, built against system GTK libraries",
    "cdms2": "not on PyPI",
}


class SpecRefused(ValueError):
    """Why an instance cannot get an environment from the published specification, in one
    sentence ("django/django 3.0 runs tests/runtests.py, not pytest")."""


@dataclass(frozen=True)
class Table:
    """The published table: specs[repo][version], the requirements and environment.yml paths
    SWE-bench looks for per repository, first found wins, and the requirement replacements it
    applies (a yanked package's name -> its replacement, None: left out)."""
    specs: Mapping[str, Mapping[str, Mapping]]
    requirements_paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    environment_yml_paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    replacements: Mapping[str, str | None] = field(default_factory=dict)
    source: str = ""


@dataclass(frozen=True)
class Derived:
    environment: dict  # EnvironmentSpec fields: python_version, python, debian, setup, env
    test_command: str  # the spec's test_cmd (the importer appends the test files)
    notes: tuple[str, ...]  # what was translated approximately or left out, one line each


def load_specs(path: Path | None = None) -> Table:
    """The table in `path` (default: swebench_specs.json beside this module)."""
    return _load(Path(path)) if path is not None else _load(SPECS)


@cache
def _load(path: Path) -> Table:
    document = json.loads(path.read_text(encoding="utf-8"))
    return Table(specs=document["specs"],
                 requirements_paths={r: tuple(p) for r, p in document.get("requirements_paths", {}).items()},
                 environment_yml_paths={r: tuple(p) for r, p in document.get("environment_yml_paths", {}).items()},
                 replacements=document.get("requirement_replacements", {}).get("replace", {}),
                 source=document.get("source", ""))


def derive(repo: str, version: str, files: Mapping[str, str], table: Table | None = None) -> Derived:
    """The environment and test command of `repo` at `version`, whose files (path -> text) are
    `files`: the repository at the commit SWE-bench reads its requirements from (the instance's
    environment_setup_commit, where it has one, else its base_commit). The caller adds
    `repository` (OWNER/NAME@commit) for the setup to run in. SpecRefused says why not."""
    table = table or load_specs()
    spec = table.specs.get(repo, {}).get(version)
    if spec is None:
        raise SpecRefused(f"no published SWE-bench specification for {repo} {version}")
    where = f"{repo} {version}"
    command = spec.get("test_cmd")
    if not isinstance(command, str) or not command.strip():
        raise SpecRefused(f"{where} publishes no test command")
    runner = _runner(command)
    if runner:
        raise SpecRefused(f"{where} runs {runner}, not pytest")
    notes: list[str] = []
    first = _packages(where, repo, spec, files, table, notes)
    python = _with_pip_packages(first, list(spec.get("pip_packages") or ()), notes)
    debian, setup = _pre_install(list(spec.get("pre_install") or ()), notes)
    if spec.get("install"):
        setup.append(_install(spec["install"], notes))
    env = _eval_commands(list(spec.get("eval_commands") or ()), notes)
    _other_fields(spec, notes)
    environment = {"python_version": str(spec["python"]), "python": python, "debian": debian, "setup": setup,
                   "env": env}
    try:
        EnvironmentSpec(**environment)
    except ValidationError as e:
        raise SpecRefused(f"{where}: its derived environment is invalid: {e.errors()[0]['msg']}") from None
    return Derived(environment, command, tuple(notes))


# -- the test command --------------------------------------------------------------------


def _runner(command: str) -> str | None:
    """None for a pytest run, else the runner's name as the refusal shows it."""
    try:
        words = shlex.split(command)
    except ValueError:
        return f"`{command}` (not a command line)"
    while words and ASSIGNMENT.fullmatch(words[0]):
        words.pop(0)
    if not words:
        return "nothing"
    program = posixpath.basename(words[0])
    if program in ("pytest", "py.test"):
        return None
    if re.fullmatch(r"python[0-9.]*", program) and words[1:3] == ["-m", "pytest"]:
        return None
    return words[0].removeprefix("./")


# -- packages ----------------------------------------------------------------------------


def _packages(where: str, repo: str, spec: Mapping, files: Mapping[str, str], table: Table,
              notes: list[str]) -> list[str]:
    packages = spec.get("packages") or ""
    if packages == "requirements.txt":
        path = _first(where, "requirements file", table.requirements_paths.get(repo, ()), files)
        return [line for line in _requirements(where, path, files, table, notes, set())]
    if packages == "environment.yml":
        path = _first(where, "conda environment.yml", table.environment_yml_paths.get(repo, ()), files)
        return _environment_yml(where, path, files, table, notes)
    try:
        items = shlex.split(packages)
    except ValueError:
        raise SpecRefused(f"{where}'s conda package list cannot be read: {packages}") from None
    return _from_conda(where, items, "its conda package list", notes)


def _first(where: str, what: str, paths: tuple[str, ...], files: Mapping[str, str]) -> str:
    if not paths:
        raise SpecRefused(f"{where} installs a {what}, and SWE-bench names no path for it")
    found = next((path for path in paths if path in files), None)
    if found is None:
        raise SpecRefused(f"{where} installs a {what}, and the repository has none of {', '.join(paths)}")
    return found


def _requirements(where: str, path: str, files: Mapping[str, str], table: Table, notes: list[str],
                  seen: set[str]) -> list[str]:
    """The requirement lines of the repository's file `path`, its includes followed."""
    seen.add(path)
    lines = []
    for raw in _logical_lines(files[path]):
        line = COMMENT.sub("", raw).strip()
        if not line:
            continue
        option, value = _option(line)
        if option in ("-r", "--requirement"):
            target = posixpath.normpath(posixpath.join(posixpath.dirname(path), value))
            if value.startswith("/") or target == ".." or target.startswith("../") or "://" in value:
                raise SpecRefused(f"{where}: {path} includes {value}, outside the repository")
            if target in seen:
                continue
            if target not in files:
                notes.append(f"{path} includes {value}, which the repository lacks: left out, as SWE-bench does")
                continue
            lines += _requirements(where, target, files, table, notes, seen)
        elif option in ("-c", "--constraint"):
            raise SpecRefused(f"{where}: {path} applies constraints ({line}), which requirement lines cannot carry")
        elif SELF_INSTALL.fullmatch(line):
            notes.append(f"{path}: `{line}` left out, as SWE-bench does (the setup installs the repository)")
        elif option in ("-e", "--editable") and not re.match(r"[a-z+]+://|git\+", value) or _local_path(line):
            raise SpecRefused(f"{where}: {path} installs the local path {value or line}, "
                              "which a requirement line outside the repository cannot name")
        else:
            lines.append(_replaced(line, table, path, notes))
    return [line for line in lines if line]


def _logical_lines(text: str) -> list[str]:
    """Lines as pip reads them: a trailing backslash continues a line."""
    return re.sub(r"\\\r?\n", "", text).splitlines()


def _option(line: str) -> tuple[str, str]:
    """("-r", "dev.txt") of "-r dev.txt", "-rdev.txt" or "--requirement=dev.txt"; ("", "") else."""
    found = re.match(r"(--[a-z-]+|-[a-zA-Z])(?:=|\s+|(?<=^-[a-zA-Z]))(.*)$", line)
    return (found.group(1), found.group(2).strip()) if found else ("", "")


def _local_path(line: str) -> bool:
    return line.startswith(("./", "../", "/", "file:")) or line in (".", "..")


def _replaced(line: str, table: Table, path: str, notes: list[str]) -> str:
    name = _name(line)
    for old, new in table.replacements.items():
        if name and _normal(name) == _normal(old):
            notes.append(f"{path}: {line} replaced by {new or 'nothing'}, as SWE-bench does (it is yanked)")
            return new or ""
    return line


def _name(line: str) -> str:
    """The project a requirement line names ("" for an option line)."""
    if line.startswith("-"):
        return ""
    found = NAME.match(line)
    return found.group(1) if found else ""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pinned(line: str) -> bool:
    """Whether a requirement line constrains the version (or names a URL)."""
    name = _name(line)
    return bool(name) and bool(SPECIFIER.match(line[line.index(name) + len(name):]))


def _specifier(line: str) -> str:
    """What a requirement line says beside its project's name, spaces left out."""
    name = _name(line)
    return line[line.index(name) + len(name):].replace(" ", "") if name else line


def _with_pip_packages(first: list[str], pip_packages: list[str], notes: list[str]) -> list[str]:
    """The packages, then pip_packages: SWE-bench installs pip_packages afterwards, so one that
    pins a package replaces the packages' line for it (an unpinned one leaves it as it is)."""
    pinned = {_normal(_name(line)): line for line in pip_packages if _pinned(line)}
    kept = []
    for line in first:
        replacing = pinned.get(_normal(_name(line))) if _name(line) else None
        if replacing is None:
            kept.append(line)
        elif _pinned(line) and _specifier(line) != _specifier(replacing):
            notes.append(f"pip_packages' {replacing} replaces {line} (SWE-bench installs pip_packages afterwards)")
    return list(dict.fromkeys([*kept, *pip_packages]))


# -- conda -------------------------------------------------------------------------------


def _from_conda(where: str, items: list[str], what: str, notes: list[str]) -> list[str]:
    """Conda match specs as PyPI requirement lines, or SpecRefused naming what has no PyPI
    equivalent."""
    lines, missing, renamed, pins, taken = [], [], [], [], []
    for item in items:
        item = item.strip()
        if "::" in item:
            channel, item = item.split("::", 1)
            notes.append(f"{what}: {item} taken from PyPI, not conda channel {channel}")
        found = re.fullmatch(r"([A-Za-z0-9_][A-Za-z0-9_.-]*)(\[[^\]]*\])?\s*(.*)", item)
        if not found:
            raise SpecRefused(f"{where}: {what} has {item!r}, which is not a conda package")
        name, extras, constraint = found.group(1), found.group(2) or "", found.group(3).strip()
        if name.lower() in ("python", "pip"):
            continue
        if name.lower() in CONDA_WITHOUT_PYPI:
            missing.append(f"{name} ({CONDA_WITHOUT_PYPI[name.lower()]})")
            continue
        pypi = CONDA_TO_PYPI.get(name.lower(), name)
        if pypi != name:
            renamed.append(f"{name} -> {pypi}")
        requirement = _conda_version(where, what, item, constraint, notes)
        if requirement != constraint.replace(" ", ""):
            pins.append(f"{item} -> {pypi}{extras}{requirement}")
        taken.append(pypi)
        lines.append(f"{pypi}{extras}{requirement}")
    if missing:
        raise SpecRefused(f"{where}: {what} needs conda packages PyPI has no equivalent of: {', '.join(missing)}")
    if taken:
        notes.append(f"{what}: conda packages installed from PyPI instead: {', '.join(dict.fromkeys(taken))}")
    if renamed:
        notes.append(f"{what}: conda packages under their PyPI names: {', '.join(renamed)}")
    if pins:
        notes.append(f"{what}: conda version pins as pip reads them: {', '.join(pins)}")
    return lines


def _conda_version(where: str, what: str, item: str, constraint: str, notes: list[str]) -> str:
    """A conda version constraint as a pip specifier: `=1.2` and a bare `1.2` match 1.2.* (as
    conda reads them), `==`, `>=`, `<`, `!=`, `~=` and commas read the same; a build string is
    dropped (noted); `|` (either) has no pip equivalent."""
    if not constraint:
        return ""
    if "|" in constraint:
        raise SpecRefused(f"{where}: {what} has {item!r}, an either-or constraint pip cannot express")
    words = constraint.split()
    if constraint.startswith("=") and not constraint.startswith("=="):
        words = constraint[1:].split("=", 1)
    version, build = words[0], words[1:]
    if build:
        notes.append(f"{what}: conda build string {' '.join(build)} of {item} dropped")
    if re.match(r"[=<>!~]", version):
        return version.replace(" ", "")
    version = re.sub(r"\.?\*$", "", version)
    return f"=={version}.*"


def _environment_yml(where: str, path: str, files: Mapping[str, str], table: Table, notes: list[str]) -> list[str]:
    conda, pip = _read_environment_yml(where, path, files[path])
    lines = _from_conda(where, conda, path, notes)
    for line in pip:
        option, value = _option(line)
        if SELF_INSTALL.fullmatch(line):
            notes.append(f"{path}: pip's `{line}` left out (the setup installs the repository)")
        elif option or _local_path(line):
            raise SpecRefused(f"{where}: {path} gives pip `{line}`, which a requirement line cannot carry")
        else:
            lines.append(_replaced(line, table, path, notes))
    return [line for line in lines if line]


def _read_environment_yml(where: str, path: str, text: str) -> tuple[list[str], list[str]]:
    """The conda dependencies and the `pip:` list of a conda environment file: the block-style
    subset such files use (SpecRefused for anything else)."""
    conda, pip, section, in_pip, pip_indent = [], [], "", False, -1
    for number, raw in enumerate(text.splitlines(), 1):
        line = COMMENT.sub("", raw).rstrip()
        if not line.strip() or line.strip() in ("---", "..."):
            continue
        indent = len(line) - len(line.lstrip())
        stripped = line.strip()
        if indent == 0:
            found = re.fullmatch(r"([A-Za-z_][\w-]*):\s*(.*)", stripped)
            if not found:
                raise SpecRefused(f"{where}: {path} line {number} is not conda environment YAML this reads")
            section, in_pip = found.group(1), False
            if section == "dependencies" and found.group(2):
                raise SpecRefused(f"{where}: {path} lists its dependencies in flow style, which this does not read")
            continue
        if section != "dependencies":
            continue
        if in_pip and indent > pip_indent:
            if not stripped.startswith("- "):
                raise SpecRefused(f"{where}: {path} line {number} is not an item of its pip list")
            pip.append(_unquoted(stripped[2:]))
            continue
        in_pip = False
        if not stripped.startswith("- "):
            raise SpecRefused(f"{where}: {path} line {number} is not a dependency item")
        item = stripped[2:].strip()
        if re.fullmatch(r"pip\s*:", item):
            in_pip, pip_indent = True, indent
        elif item.endswith(":") or ": " in item:
            raise SpecRefused(f"{where}: {path} line {number} has a dependency section other than pip: {item}")
        else:
            conda.append(_unquoted(item))
    return conda, pip


def _unquoted(item: str) -> str:
    item = item.strip()
    return item[1:-1] if len(item) > 1 and item[0] == item[-1] and item[0] in "'\"" else item


# -- commands ----------------------------------------------------------------------------


def _pre_install(commands: list[str], notes: list[str]) -> tuple[list[str], list[str]]:
    """Debian packages and setup steps of the pre_install commands."""
    debian, setup = [], []
    for command in commands:
        parts = _split_and(command)
        kept = []
        for part in parts:
            words = _words(part)
            if not words:
                notes.append(f"pre_install `{command}`: an empty step (a stray &&) skipped")
                continue
            if words[0] in ("apt-get", "apt"):
                action = next((w for w in words[1:] if not w.startswith("-")), "")
                if action == "install":
                    debian += [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
                elif action in APT_DROPPED:
                    if action != "update":
                        notes.append(f"pre_install: `apt-get {action}` left out")
                else:
                    notes.append(f"pre_install: `{part.strip()}` left out (apt beyond installing packages)")
                continue
            if words[0] in ROOT_COMMANDS or re.search(r"(^|[\s>'\"=])/etc/", part):
                notes.append(f"pre_install: `{part.strip()}` left out: it needs root (the sandbox keeps its own "
                             "locale and /etc)")
                continue
            kept.append(part.strip())
            debian += [BASE_IMAGE_TOOLS[words[0]]] if words[0] in BASE_IMAGE_TOOLS else []
        if kept == [part.strip() for part in parts]:
            setup.append(_testbed(command.strip(), notes))
        elif kept:
            setup.append(_testbed(" && ".join(kept), notes))
    tools = [tool for tool in dict.fromkeys(debian) if tool in BASE_IMAGE_TOOLS.values()]
    if tools:
        notes.append(f"Debian packages added for tools the setup steps call (SWE-bench's base image has them): "
                     f"{', '.join(tools)}")
    return list(dict.fromkeys(debian)), setup


def _split_and(command: str) -> list[str]:
    """The parts of `command` between `&&` outside quotes."""
    parts, current, quote, i = [], "", "", 0
    while i < len(command):
        c = command[i]
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif command.startswith("&&", i):
            parts.append(current)
            current, i = "", i + 2
            continue
        current += c
        i += 1
    return [*parts, current]


def _words(part: str) -> list[str]:
    """The words of a simple command, leading VAR=value assignments left out."""
    try:
        words = shlex.split(part)
    except ValueError:
        return [part]
    while len(words) > 1 and ASSIGNMENT.fullmatch(words[0]):
        words.pop(0)
    return words


def _testbed(command: str, notes: list[str]) -> str:
    if not TESTBED.search(command):
        return command
    notes.append(f"`{command}`: SWE-bench's /testbed read as the repository (the setup's directory)")
    return TESTBED.sub(".", command)


def _install(install: str, notes: list[str]) -> str:
    """The install as a setup step: editable, since Crucible installs once, at build time."""
    step = install.strip()
    if re.search(r"\bsetup\.py\s+install\b", step):
        step = re.sub(r"\bsetup\.py\s+install\b", "setup.py develop", step)
    elif re.search(r"\bpip\s+install\b", step) and not re.search(r"(^|\s)(-e|--editable)(\s|=|$)", step):
        step = re.sub(r"(?<=\s)(['\"]?\.(?:\[[^\]]*\])?['\"]?)(?=\s|$)", r"-e \1", step, count=1)
    if step != install.strip():
        notes.append(f"install `{install}` made editable (`{step}`): SWE-bench reinstalls before the tests, "
                     "Crucible installs once, so the tests must see the workspace")
    return _testbed(step, notes)


def _eval_commands(commands: list[str], notes: list[str]) -> dict[str, str]:
    env = {}
    for command in commands:
        try:
            words = shlex.split(command)
        except ValueError:
            words = []
        if len(words) > 1 and words[0] == "export" and all(ASSIGNMENT.fullmatch(w) for w in words[1:]):
            for word in words[1:]:
                name, value = word.split("=", 1)
                if name in RESERVED_ENV:
                    notes.append(f"eval_commands: `{command}` left out: the environment sets {name} itself")
                else:
                    env[name] = value
        else:
            notes.append(f"eval_commands: `{command}` left out")
    return env


def _other_fields(spec: Mapping, notes: list[str]) -> None:
    if spec.get("nano_cpus"):
        notes.append(f"SWE-bench runs these tests on {spec['nano_cpus'] / 1e9:g} CPUs; the task's limits apply instead")
    for name in sorted(set(spec) - KNOWN_FIELDS):
        notes.append(f"specification field {name} not translated")
