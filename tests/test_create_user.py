"""manage.py create_user: a new staff account in one role, through permissions.user_create, audited
without the password; clear refusals for an existing user, an unknown role, a weak or missing password."""
from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from trajplatform.audit import AuditEvent
from trajplatform.permissions import ROLES, highest_role

pytestmark = pytest.mark.django_db

PASSWORD = "a-long-enough-Passphrase-42"


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(*args: str, stdin: str | None = None, monkeypatch: Any = None) -> str:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    out = io.StringIO()
    call_command("create_user", *args, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize("role", ROLES)
def test_it_creates_a_staff_user_in_the_role_from_stdin(monkeypatch: Any, role: str) -> None:
    out = run("alice", "--role", role, "--email", "alice@example.test", "--password-stdin",
              stdin=PASSWORD + "\n", monkeypatch=monkeypatch)

    assert f"Created user 'alice' with role {role}" in out
    user = User.objects.get(username="alice")
    assert user.is_staff and user.is_active and not user.is_superuser
    assert list(user.groups.values_list("name", flat=True)) == [role] and highest_role(user) == role
    assert user.check_password(PASSWORD) and user.email == "alice@example.test"
    event = AuditEvent.objects.get(action="auth.user_create")
    assert (event.target_id, event.actor_repr) == (str(user.pk), "manage.py create_user")
    assert event.data == {"role": role, "email": "alice@example.test", "is_staff": True, "password_set": True}
    assert PASSWORD not in str(event.data) and user.password not in str(event.data)


def test_the_new_reviewer_can_sign_in_and_lands_on_the_review_queue(client: Any, monkeypatch: Any) -> None:
    run("bob", "--role", "reviewer", "--password-stdin", stdin=PASSWORD + "\n", monkeypatch=monkeypatch)
    response = client.post("/admin/login/", {"username": "bob", "password": PASSWORD, "next": "/"}, follow=True)
    assert response.redirect_chain[-1][0] == "/review/work/"


def test_an_existing_user_is_refused_and_left_as_it_was(monkeypatch: Any, make_user: Any) -> None:
    existing = make_user("viewer", username="carol")
    with pytest.raises(CommandError, match="a user named 'carol' exists; change its role with the admin's Grant role"):
        run("carol", "--role", "approver", "--password-stdin", stdin=PASSWORD + "\n", monkeypatch=monkeypatch)
    existing.refresh_from_db()
    assert list(existing.groups.values_list("name", flat=True)) == ["viewer"]
    assert not AuditEvent.objects.filter(action="auth.user_create").exists()


def test_an_unknown_role_is_refused_naming_the_roles(monkeypatch: Any) -> None:
    with pytest.raises(CommandError, match=r"invalid choice: 'operator' \(choose from 'viewer', 'reviewer', 'approver', 'admin'\)"):
        run("dave", "--role", "operator", "--password-stdin", stdin=PASSWORD + "\n", monkeypatch=monkeypatch)
    assert not User.objects.exists()


@pytest.mark.parametrize(("stdin", "message"), [
    ("12345\n", "too short"),
    ("\n", "standard input held no password"),
    ("", "standard input held no password"),
])
def test_a_weak_or_missing_password_from_stdin_is_refused(monkeypatch: Any, stdin: str, message: str) -> None:
    with pytest.raises(CommandError, match=message):
        run("erin", "--role", "reviewer", "--password-stdin", stdin=stdin, monkeypatch=monkeypatch)
    assert not User.objects.exists() and not AuditEvent.objects.exists()


def test_a_bad_email_and_an_empty_username_are_refused(monkeypatch: Any) -> None:
    with pytest.raises(CommandError, match="valid email"):
        run("frank", "--role", "reviewer", "--email", "not-an-email", "--password-stdin",
            stdin=PASSWORD + "\n", monkeypatch=monkeypatch)
    with pytest.raises(CommandError, match="a username is required"):
        run("  ", "--role", "reviewer", "--password-stdin", stdin=PASSWORD + "\n", monkeypatch=monkeypatch)
    assert not User.objects.exists()


def test_without_a_tty_and_without_password_stdin_it_refuses(monkeypatch: Any) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(PASSWORD + "\n"))
    with pytest.raises(CommandError, match="stdin is not a terminal.*--password-stdin"):
        run("gina", "--role", "reviewer")
    assert not User.objects.exists()


def test_it_prompts_twice_on_a_tty(monkeypatch: Any) -> None:
    answers = iter([PASSWORD, PASSWORD])
    monkeypatch.setattr(sys, "stdin", FakeTTY())
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    assert "Created user 'hank' with role approver" in run("hank", "--role", "approver")
    assert User.objects.get(username="hank").check_password(PASSWORD)


def test_mismatched_prompt_answers_are_refused(monkeypatch: Any) -> None:
    answers = iter([PASSWORD, PASSWORD + "x"])
    monkeypatch.setattr(sys, "stdin", FakeTTY())
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    with pytest.raises(CommandError, match="do not match"):
        run("ivy", "--role", "viewer")
    assert not User.objects.exists()


def test_help_lists_every_role() -> None:
    # --help prints and exits, so run it as the operator would (no database needed).
    result = subprocess.run([sys.executable, "manage.py", "create_user", "--help"], cwd=Path(settings.BASE_DIR),
                            capture_output=True, text=True, timeout=120, check=True)
    text = " ".join(result.stdout.split())
    for role in ROLES:
        assert f"{role}:" in text
    assert "{viewer,reviewer,approver,admin}" in text and "--password-stdin" in text
