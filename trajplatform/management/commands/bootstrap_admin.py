"""Create or update an admin account: `manage.py bootstrap_admin USERNAME [--email E] [--password-env VAR]`."""
from __future__ import annotations

import os
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from trajplatform.management.passwords import prompt_password
from trajplatform.permissions import bootstrap_admin


class Command(BaseCommand):
    help = (
        "Create or update an admin (staff, superuser, in the 'admin' group). Safe to re-run: it sets the "
        "password and flags again. The password comes from --password-env VAR, or an interactive prompt."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--email", default=None, help="set (or replace) the account's email address")
        parser.add_argument(
            "--password-env",
            metavar="VAR",
            default=None,
            help="name of the environment variable holding the password (never pass a password as an argument)",
        )

    def handle(self, *args: Any, username: str, email: str | None, password_env: str | None, **options: Any) -> None:
        if password_env:
            password = self._password_from_env(password_env)
        else:
            password = prompt_password("use --password-env VAR with the password in the environment variable VAR")
        try:
            user, created = bootstrap_admin(username=username, email=email, password=password)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        verb = "Created" if created else "Updated"
        self.stdout.write(self.style.SUCCESS(f"{verb} admin user {user.get_username()!r}"))

    def _password_from_env(self, var: str) -> str:
        value = os.environ.get(var, "")
        if not value:
            raise CommandError(f"--password-env {var}: the environment variable {var} is unset or empty")
        return value
