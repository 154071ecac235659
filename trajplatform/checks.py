"""System checks of the deployment (`manage.py check --deploy`).

`env_file_permissions`: the environment file the systemd units read (TRAJ_ENV_FILE, default
/etc/trajplatform.env: DJANGO_SECRET_KEY, DATABASE_URL, provider keys) must not be readable by
other users. Every local sandbox's code runs as an unprivileged host user (`nobody`), and any
other account or service on the host could read a world-readable copy; keep it 0600, owned by
root (systemd reads it as root before dropping to the service's user).
"""
from __future__ import annotations

import os
import stat
from typing import Any

from django.conf import settings
from django.core import checks

ENV_FILE_READABLE = "trajplatform.W001"


@checks.register(checks.Tags.security, deploy=True)
def env_file_permissions(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    path = getattr(settings, "TRAJ_ENV_FILE", "")
    if not path:
        return []
    try:
        st = os.stat(path)
    except OSError:  # not deployed with an env file here (or not ours to look at)
        return []
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o007:
        return []
    return [checks.Warning(
        f"{path} (mode {mode:04o}) can be read by every user of this host; it holds the secret key and "
        "the database password",
        hint=f"chmod 600 {path} (owned by root: systemd reads it before starting the services)",
        id=ENV_FILE_READABLE,
    )]
