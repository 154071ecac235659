"""manage.py bootstrap_admin: creates or updates an admin, idempotently, and audits without the password."""
from __future__ import annotations

import io
import json
import sys
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command

from trajplatform.audit import AuditEvent
from trajplatform.permissions import bootstrap_admin

pytestmark = pytest.mark.django_db

PASSWORD = "a-long-enough-Passphrase-42"
NEW_PASSWORD = "another-long-Passphrase-43"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("bootstrap_admin", *args, stdout=out)
    return out.getvalue()


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_it_creates_an_admin_from_an_environment_variable(monkeypatch: Any) -> None:
    monkeypatch.setenv("ADMIN_PW", PASSWORD)

    out = run("root", "--email", "root@example.test", "--password-env", "ADMIN_PW")

    assert "Created admin user 'root'" in out
    user = User.objects.get(username="root")
    assert user.is_staff and user.is_superuser and user.is_active
    assert user.email == "root@example.test"
    assert user.check_password(PASSWORD)
    assert list(user.groups.values_list("name", flat=True)) == ["admin"]


def test_rerunning_updates_password_and_flags_without_duplicates(monkeypatch: Any) -> None:
    monkeypatch.setenv("ADMIN_PW", PASSWORD)
    run("root", "--email", "root@example.test", "--password-env", "ADMIN_PW")
    User.objects.filter(username="root").update(is_staff=False, is_superuser=False, is_active=False)
    User.objects.get(username="root").groups.clear()
    monkeypatch.setenv("ADMIN_PW", NEW_PASSWORD)

    out = run("root", "--password-env", "ADMIN_PW")
    run("root", "--password-env", "ADMIN_PW")

    assert "Updated admin user 'root'" in out
    assert User.objects.filter(username="root").count() == 1
    user = User.objects.get(username="root")
    assert user.is_staff and user.is_superuser and user.is_active
    assert user.email == "root@example.test"  # kept when --email is not given
    assert user.check_password(NEW_PASSWORD) and not user.check_password(PASSWORD)
    assert list(user.groups.values_list("name", flat=True)) == ["admin"]
    assert Group.objects.filter(name="admin").count() == 1
    events = list(AuditEvent.objects.filter(action="auth.bootstrap_admin").order_by("id"))
    assert [e.data["created"] for e in events] == [True, False, False]
    assert events[1].data["flags_set"] == ["is_staff", "is_superuser", "is_active"]


@pytest.mark.parametrize("value", [None, ""])
def test_a_missing_or_empty_password_variable_is_a_clear_error(monkeypatch: Any, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("ADMIN_PW", raising=False)
    else:
        monkeypatch.setenv("ADMIN_PW", value)
    with pytest.raises(CommandError, match="ADMIN_PW is unset or empty"):
        run("root", "--password-env", "ADMIN_PW")
    assert not User.objects.exists()


def test_without_a_tty_and_without_password_env_it_refuses(monkeypatch: Any) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(PASSWORD + "\n"))
    with pytest.raises(CommandError, match="stdin is not a terminal.*--password-env"):
        run("root")
    assert not User.objects.exists()


def test_it_prompts_twice_on_a_tty(monkeypatch: Any) -> None:
    answers = iter([PASSWORD, PASSWORD])
    monkeypatch.setattr(sys, "stdin", FakeTTY())
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    assert "Created admin user 'root'" in run("root")
    assert User.objects.get(username="root").check_password(PASSWORD)


def test_mismatched_prompt_answers_are_refused(monkeypatch: Any) -> None:
    answers = iter([PASSWORD, NEW_PASSWORD])
    monkeypatch.setattr(sys, "stdin", FakeTTY())
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    with pytest.raises(CommandError, match="do not match"):
        run("root")
    assert not User.objects.exists()


def test_a_weak_password_is_refused(monkeypatch: Any) -> None:
    monkeypatch.setenv("ADMIN_PW", "12345")
    with pytest.raises(CommandError, match="too short"):
        run("root", "--password-env", "ADMIN_PW")
    assert not User.objects.exists()


def test_the_audit_row_never_holds_the_password(monkeypatch: Any) -> None:
    monkeypatch.setenv("ADMIN_PW", PASSWORD)
    run("root", "--email", "root@example.test", "--password-env", "ADMIN_PW")

    event = AuditEvent.objects.get(action="auth.bootstrap_admin")
    user = User.objects.get(username="root")
    assert (event.target_type, event.target_id, event.actor_repr) == ("auth.user", str(user.pk), "manage.py bootstrap_admin")
    assert event.data["created"] is True and event.data["email"] == "root@example.test"
    stored = json.dumps(event.data) + event.target_repr + event.actor_repr
    assert PASSWORD not in stored
    assert user.password not in stored


def test_the_service_returns_the_user_and_whether_it_was_created() -> None:
    user, created = bootstrap_admin(username="ops", email=None, password=PASSWORD)
    assert created and user.is_superuser
    again, created_again = bootstrap_admin(username="ops", email="ops@example.test", password=NEW_PASSWORD)
    assert (again.pk, created_again, again.email) == (user.pk, False, "ops@example.test")
