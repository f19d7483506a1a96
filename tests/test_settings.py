"""The deployment's settings (commands/settings.py): the variables, the optional file, a command's
own option over both, and one line per wrong setting."""

from __future__ import annotations

import pytest

from commands.errors import UserError
from commands.settings import PREFIX, Settings, load_settings

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def no_outside_settings(tmp_path, monkeypatch):
    """This test's own folder, settings file and variables only."""
    for name in Settings.model_fields:
        monkeypatch.delenv(f"{PREFIX}{name.upper()}", raising=False)
    monkeypatch.setenv("CRUCIBLE_SETTINGS", str(tmp_path / "settings.toml"))
    monkeypatch.chdir(tmp_path)


def test_the_file_a_variable_and_a_commands_option_each_win_over_the_one_before(tmp_path, monkeypatch):
    (tmp_path / "settings.toml").write_text('storage_root = "s3://file/data"\nsandbox = "docker"\ngrading_shards = 3\n')
    monkeypatch.setenv("CRUCIBLE_SANDBOX", "local")
    settings = load_settings(storage_root="s3://option/data")
    assert (settings.storage_root, settings.sandbox, settings.grading_shards) == ("s3://option/data", "local", 3)
    assert load_settings(storage_root=None).storage_root == "s3://file/data"  # an option not given is no value


def test_relative_paths_are_the_folder_the_settings_were_read_in(tmp_path):
    settings = load_settings()
    assert settings.checkpoint_root == str(tmp_path / ".crucible" / "checkpoints")
    assert settings.environment()["CRUCIBLE_TASK_SETS"] == str(tmp_path / ".crucible" / "task_sets")


def test_every_wrong_setting_is_one_line_that_names_its_variable(monkeypatch):
    monkeypatch.setenv("CRUCIBLE_TRAIN_CLIENT", "k8s")
    monkeypatch.setenv("CRUCIBLE_STEP_PROCESSES", "0")
    monkeypatch.setenv("CRUCIBLE_DOCKER_HOSTS", "unix:///a.sock")
    with pytest.raises(UserError) as refused:
        load_settings()
    assert str(refused.value).splitlines() == [
        "CRUCIBLE_DOCKER_HOSTS: 'unix:///a.sock' is not URL=CAPACITY (for example unix:///var/run/docker.sock=16; "
        "the capacity a whole number ≥ 1)",
        "CRUCIBLE_TRAIN_CLIENT='k8s': choose one of subprocess, docker, kubernetes",
        "CRUCIBLE_STEP_PROCESSES='0': Input should be greater than or equal to 1",
    ]


def test_a_setting_that_needs_another_says_which(monkeypatch):
    monkeypatch.setenv("CRUCIBLE_RUN_LAUNCHER", "docker")
    with pytest.raises(UserError, match=r"^CRUCIBLE_RUN_LAUNCHER=docker needs CRUCIBLE_RUN_IMAGE"):
        load_settings()


def test_a_misspelt_key_in_the_file_is_refused_naming_the_file(tmp_path):
    (tmp_path / "settings.toml").write_text('storage_rot = "elsewhere"\n')
    with pytest.raises(UserError, match=rf"^{tmp_path / 'settings.toml'}: 'storage_rot' is not a setting; "
                                        "the settings are storage_root, checkpoint_root"):
        load_settings()


def test_an_unknown_variable_is_left_to_whoever_reads_it(monkeypatch):
    monkeypatch.setenv("CRUCIBLE_REQUIRE_BACKENDS", "local")  # the tests' own
    assert load_settings().sandbox == "local"
