"""`manage.py check --deploy`: the env file's permissions (trajplatform.checks)."""
from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from trajplatform.checks import ENV_FILE_READABLE, env_file_permissions


@pytest.mark.parametrize("mode, warned", [(0o644, True), (0o604, True), (0o600, False), (0o640, False)])
def test_an_env_file_other_users_can_read_is_warned_about(settings, tmp_path, mode, warned):
    env = tmp_path / "trajplatform.env"
    env.write_text("DJANGO_SECRET_KEY=x\n")
    env.chmod(mode)
    settings.TRAJ_ENV_FILE = str(env)
    messages = env_file_permissions()
    assert [m.id for m in messages] == ([ENV_FILE_READABLE] if warned else [])
    if warned:
        assert f"{env} (mode {mode:04o}) can be read by every user" in messages[0].msg
        assert messages[0].hint.startswith(f"chmod 600 {env}")


def test_it_is_a_deploy_check_and_silent_without_the_file(settings, tmp_path):
    env = tmp_path / "trajplatform.env"
    env.write_text("DJANGO_SECRET_KEY=x\n")
    env.chmod(0o644)
    settings.TRAJ_ENV_FILE = str(env)
    out, err = io.StringIO(), io.StringIO()
    call_command("check", stdout=out, stderr=err)  # not without --deploy
    assert ENV_FILE_READABLE not in out.getvalue() + err.getvalue()
    call_command("check", "--deploy", "--tag", "security", stdout=out, stderr=err)
    assert ENV_FILE_READABLE in out.getvalue() + err.getvalue()
    settings.TRAJ_ENV_FILE = str(tmp_path / "missing.env")
    assert env_file_permissions() == []
    settings.TRAJ_ENV_FILE = ""
    assert env_file_permissions() == []
