"""The account commands' interactive password prompt (bootstrap_admin, create_user)."""
from __future__ import annotations

import getpass
import sys

from django.core.management.base import CommandError


def prompt_password(otherwise: str) -> str:
    """Ask twice on the terminal; `otherwise` says how to pass it when stdin is not a terminal."""
    if sys.stdin is None or not sys.stdin.isatty():
        raise CommandError(f"stdin is not a terminal, so the password cannot be prompted for; {otherwise}")
    first = getpass.getpass("Password: ")
    second = getpass.getpass("Password (again): ")
    if not first:
        raise CommandError("the password is empty")
    if first != second:
        raise CommandError("the two passwords do not match")
    return first
