"""Create a console account in one role: `manage.py create_user USERNAME --role ROLE [--email E] [--password-stdin]`."""
from __future__ import annotations

import sys
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from trajplatform.management.passwords import prompt_password
from trajplatform.permissions import ROLE_DESCRIPTIONS, ROLES, UserExists, user_create


def _roles_help() -> str:
    return "; ".join(f"{role}: {ROLE_DESCRIPTIONS[role]}" for role in ROLES)


class Command(BaseCommand):
    help = (
        "Create a new staff account in one role (audited as auth.user_create). Refuses a username that "
        "exists (change its role with the admin's Grant role action). The password comes from "
        "--password-stdin (the first line of standard input) or an interactive prompt; it is never an "
        f"argument. Roles, each including the one before it: {_roles_help()}. "
        "For an admin with superuser status use bootstrap_admin."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=ROLES, help=f"one of {', '.join(ROLES)}")
        parser.add_argument("--email", default=None, help="the account's email address")
        parser.add_argument("--password-stdin", action="store_true",
                            help="read the password from the first line of standard input (e.g. a pipe)")

    def handle(self, *args: Any, username: str, role: str, email: str | None, password_stdin: bool,
               **options: Any) -> None:
        password = self._password_from_stdin() if password_stdin else prompt_password("pipe it in with --password-stdin")
        try:
            user = user_create(username=username, role=role, password=password, email=email)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        except (UserExists, ValueError, RuntimeError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(self.style.SUCCESS(f"Created user {user.get_username()!r} with role {role}"))

    def _password_from_stdin(self) -> str:
        line = sys.stdin.readline() if sys.stdin is not None else ""
        password = line.rstrip("\r\n")
        if not password:
            raise CommandError("--password-stdin: standard input held no password (an empty first line)")
        return password
