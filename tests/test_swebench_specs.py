"""SWE-bench environments derived from SWE-bench's published specification table
(task_sets/importers/swebench_specs.json, from swebench 4.1.0 on PyPI): every entry either
derives an environment EnvironmentSpec accepts or is refused in one sentence, and the
translation rules hold on the real entries."""

from __future__ import annotations

import re

import pytest

from environments.spec import EnvironmentSpec
from task_sets.importers.swebench_specs import SpecRefused, Table, derive, load_specs

TABLE = load_specs()
EVERY = [(repo, version) for repo, versions in sorted(TABLE.specs.items()) for version in sorted(versions)]
# What the published table runs that is not pytest, by repository (all its versions).
NOT_PYTEST = {"django/django": "runs tests/runtests.py, not pytest", "sphinx-doc/sphinx": "runs tox, not pytest",
              "sympy/sympy": "runs bin/test, not pytest", "swe-bench/humaneval": "runs python, not pytest",
              "dbt-labs/dbt-core": "publishes no test command"}
ENVIRONMENT_YML = """\
name: testbed
channels:
  - conda-forge
dependencies:
  - python>=3.9
  - numpy>=1.21  # runtime
  - matplotlib-base
  - pydata-sphinx-theme=0.13
  - nbconvert[execute]!=6.0.0
  - pip
  - pip:
      - mpl-sphinx-theme~=3.8.0
      - -e .
"""


def files_for(repo: str) -> dict[str, str]:
    """A repository holding the first requirements file and environment.yml SWE-bench looks for."""
    files = {}
    if repo in TABLE.requirements_paths:
        files[TABLE.requirements_paths[repo][0]] = "pytest\n"
    if repo in TABLE.environment_yml_paths:
        files[TABLE.environment_yml_paths[repo][0]] = ENVIRONMENT_YML
    return files


def table_with(spec: dict, **paths) -> Table:
    return Table(specs={"o/r": {"1.0": {"python": "3.9", "test_cmd": "pytest -rA", **spec}}}, **paths)


def test_the_table_is_swebench_4_1_0s_as_published():
    assert TABLE.source == "swebench 4.1.0 (PyPI), swebench/harness/constants/python.py"
    assert (len(TABLE.specs), len(EVERY)) == (20, 300)
    assert TABLE.replacements == {"types-pkg_resources": "types-setuptools"}


@pytest.mark.parametrize(("repo", "version"), EVERY, ids=[f"{r}@{v}" for r, v in EVERY])
def test_every_published_specification_derives_an_environment_or_is_refused_in_one_sentence(repo, version):
    if repo in NOT_PYTEST:
        with pytest.raises(SpecRefused) as refused:
            derive(repo, version, files_for(repo))
        message = str(refused.value)
        assert message == f"{repo} {version} {NOT_PYTEST[repo]}"
        assert "\n" not in message and not re.search(r"\.\s+[A-Z]", message)
        return
    derived = derive(repo, version, files_for(repo))
    spec = EnvironmentSpec(**derived.environment)
    assert spec.python_version == TABLE.specs[repo][version]["python"]
    assert derived.test_command == TABLE.specs[repo][version]["test_cmd"]
    assert re.search(r"pip install .*-e |setup\.py build; python setup\.py develop$", spec.setup[-1])  # editable
    assert all("\n" not in note for note in derived.notes)


def test_a_repository_without_the_requirements_file_its_specification_installs_is_refused_naming_the_paths():
    with pytest.raises(SpecRefused, match=r"^sqlfluff/sqlfluff 2\.2 installs a requirements file, and the "
                                          r"repository has none of requirements_dev\.txt$"):
        derive("sqlfluff/sqlfluff", "2.2", {"setup.py": ""})


def test_flask_2_3_gets_python_3_11_its_pip_packages_and_an_editable_install():
    derived = derive("pallets/flask", "2.3", {"requirements/dev.txt": "pytest==7.3.1\n"})
    environment = derived.environment
    assert environment["python_version"] == "3.11"
    assert environment["python"] == ["pytest==7.3.1", *TABLE.specs["pallets/flask"]["2.3"]["pip_packages"]]
    assert environment["setup"] == ["python -m pip install -e ."]
    assert (environment["debian"], environment["env"], derived.test_command) == ([], {}, "pytest -rA")


def test_requirements_includes_are_followed_from_the_including_files_folder_and_self_installs_dropped():
    files = {"requirements/dev/dev-requirements.txt": "-r ../testing/all.txt\n-r ../doc/missing.txt\n",
             "requirements/testing/all.txt": "# tests\ncodecov\npytest>=3.6,<4  # pinned\n"
                                             "    # via nothing\n-e .[test]\n-r extra.txt\n",
             "requirements/testing/extra.txt": "pytest-xdist\n-r all.txt\n"}
    derived = derive("matplotlib/matplotlib", "3.4", files)
    assert derived.environment["python"] == ["codecov", "pytest>=3.6,<4", "pytest-xdist", "pytest", "ipython"]
    assert any("missing.txt, which the repository lacks" in note for note in derived.notes)
    assert any("`-e .[test]` left out" in note for note in derived.notes)


def test_an_include_outside_the_repository_is_refused():
    with pytest.raises(SpecRefused, match=r"includes \.\./\.\./x\.txt, outside the repository"):
        derive("pallets/flask", "2.3", {"requirements/dev.txt": "-r ../../x.txt\n"})


def test_django_is_refused_as_not_pytest():
    with pytest.raises(SpecRefused, match=r"^django/django 3\.0 runs tests/runtests\.py, not pytest$"):
        derive("django/django", "3.0", {"tests/requirements/py3.txt": "asgiref\n"})


def test_an_unknown_version_or_repository_is_refused():
    with pytest.raises(SpecRefused, match=r"^no published SWE-bench specification for pallets/flask 9\.9$"):
        derive("pallets/flask", "9.9", {})
    with pytest.raises(SpecRefused, match=r"^no published SWE-bench specification for nobody/nothing 1\.0$"):
        derive("nobody/nothing", "1.0", {})


def test_a_conda_pin_means_what_conda_matches_and_other_constraints_read_the_same():
    derived = derive("o/r", "1.0", {}, table_with({"packages": "numpy=1.19 scipy=1.5.2=py39_0 'pandas<2.0.0' "
                                                             "conda-forge::cython==3.0.10 dask-core"}))
    assert derived.environment["python"] == ["numpy==1.19.*", "scipy==1.5.2.*", "pandas<2.0.0", "cython==3.0.10",
                                             "dask"]
    assert any("numpy=1.19 -> numpy==1.19.*" in note for note in derived.notes)
    assert any("build string py39_0" in note for note in derived.notes)
    assert any("dask-core -> dask" in note for note in derived.notes)


def test_an_environment_yml_becomes_pip_lines_with_its_pip_list_as_it_is():
    derived = derive("matplotlib/matplotlib", "3.7", {"environment.yml": ENVIRONMENT_YML})
    pip_packages = TABLE.specs["matplotlib/matplotlib"]["3.7"]["pip_packages"]
    assert derived.environment["python"] == ["matplotlib", "pydata-sphinx-theme==0.13.*", "nbconvert[execute]!=6.0.0",
                                             "mpl-sphinx-theme~=3.8.0", *pip_packages]
    assert any("pip_packages' numpy==1.25.2 replaces numpy>=1.21" in note for note in derived.notes)


def test_an_environment_yml_needing_conda_only_packages_is_refused_naming_them():
    yml = "name: xarray-tests\ndependencies:\n  - cdms2\n  - hdf5\n  - h5py\n  - pip:\n      - numbagg\n"
    with pytest.raises(SpecRefused, match=r"^pydata/xarray 2022\.06: ci/requirements/environment\.yml needs conda "
                                          r"packages PyPI has no equivalent of: cdms2 \(not on PyPI\), hdf5 "
                                          r"\(a C library\)$"):
        derive("pydata/xarray", "2022.06", {"ci/requirements/environment.yml": yml})


def test_pip_packages_that_pin_a_package_replace_the_requirements_files_pin_as_swebench_installs_them_after():
    derived = derive("pallets/flask", "2.0", {"requirements/dev.txt": "click==8.0.0\njinja2==2.11.3\npytest\n"})
    assert derived.environment["python"] == ["pytest", *TABLE.specs["pallets/flask"]["2.0"]["pip_packages"]]
    assert any("click==8.0.1 replaces click==8.0.0" in note for note in derived.notes)


def test_a_yanked_requirement_is_replaced_as_swebench_does():
    derived = derive("sqlfluff/sqlfluff", "1.0", {"requirements_dev.txt": "pytest\ntypes-pkg_resources\n"})
    assert derived.environment["python"] == ["pytest", "types-setuptools"]


def test_apt_get_install_becomes_debian_packages_and_the_other_pre_install_steps_run_before_the_install():
    derived = derive("matplotlib/matplotlib", "3.4", {"requirements/dev/dev-requirements.txt": "pytest\n"})
    environment = derived.environment
    assert environment["debian"][:4] == ["imagemagick", "ffmpeg", "libfreetype6-dev", "pkg-config"]
    assert environment["debian"][-1] == "wget"  # the qhull download's, from SWE-bench's base image
    assert environment["setup"][2] == 'QHULL_BUILD_DIR="./build"'  # /testbed: the repository
    assert environment["setup"][-1] == "python -m pip install -e ."
    assert not any("apt-get" in step for step in environment["setup"])


def test_pre_install_steps_that_need_root_are_left_out_with_a_note_and_exports_become_env():
    derived = derive("o/r", "1.0", {}, table_with({
        "pre_install": ["apt-get update && apt-get install -y locales", "echo 'en_US UTF-8' > /etc/locale.gen",
                        "locale-gen en_US.UTF-8", "sed -i 's/a/b/' setup.cfg"],
        "install": "python -m pip install -e .",
        "eval_commands": ["export LANG=en_US.UTF-8", "export PATH=/x", "ulimit -n 4096"]}))
    environment = derived.environment
    assert environment["debian"] == ["locales"]
    assert environment["setup"] == ["sed -i 's/a/b/' setup.cfg", "python -m pip install -e ."]
    assert environment["env"] == {"LANG": "en_US.UTF-8"}
    assert sum("needs root" in note for note in derived.notes) == 2
    assert any("`ulimit -n 4096` left out" in note for note in derived.notes)


def test_a_non_editable_install_becomes_editable_since_crucible_installs_once():
    derived = derive("psf/requests", "2.27", {})
    assert derived.environment["setup"] == ["python -m pip install -e ."]
    assert derived.environment["python"] == ["pytest"]  # its conda package list
    legacy = derive("matplotlib/matplotlib", "2.2", {})
    assert legacy.environment["setup"] == ["python setup.py build; python setup.py develop"]
    assert legacy.environment["debian"] == ["imagemagick", "ffmpeg"]  # despite the published stray `&& &&`
