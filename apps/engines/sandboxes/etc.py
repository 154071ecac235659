"""The sandbox's own /etc: a few files programs need, never the host's configuration.

The host's /etc holds what no agent's code should read: the platform's env file
(/etc/trajplatform.env: the secret key, the database URL), other services' configuration,
credential helpers, the host's users. A local sandbox gets instead a directory built here once
per process and SANDBOX_ROOT (`SANDBOX_ROOT/etc-<digest>/`, written into a private temporary
directory and renamed into place, so no sandbox ever binds half of it) and bound read-only at
/etc:

- written here: passwd and group naming root and the sandbox user (`sandbox`, home /workspace),
  hosts (localhost, and `sandbox`: the sandbox's hostname), hostname, nsswitch.conf (files only);
  no resolv.conf: local sandboxes have no network (a backend with egress brings its own).
- copied from the host, when world-readable: what the dynamic loader, Python, OpenSSL, git,
  node, fontconfig and Chromium read (HOST_FILES): ld.so.cache, localtime, the CA bundle and
  openssl.cnf (not ssl/private), the Debian alternatives /usr/bin/awk, which, ... point through
  (not the manual pages'), Python's sitecustomize, Chromium's flags, fonts.conf. A symbolic link
  is copied as a link only when it ends in /usr or inside this /etc; anything else is left out.

The digest covers every entry, so a host change (new certificates) gives a new directory for
the next process; the old one stays for sandboxes still using it (a few hundred KB).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from apps.engines.sandboxes.base import WORKDIR

HOST_ETC = Path("/etc")
# Relative to /etc; a directory is taken with everything (world-readable) in it.
HOST_FILES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d",                 # the dynamic loader
    "localtime", "timezone",                                     # time zone
    # TLS: the CA bundle (OpenSSL's CAfile: Python, git, curl; not the CApath hash links) and
    # its configuration; never ssl/private.
    "ssl/certs/ca-certificates.crt", "ssl/openssl.cnf",
    "alternatives",                                              # /usr/bin/awk, which, pager, ...
    "python3", "python3.11",                                     # Debian Python's sitecustomize
    "mime.types", "protocols", "services", "networks", "host.conf", "gai.conf", "shells",
    "locale.alias", "magic", "magic.mime", "os-release", "debian_version",
    "fonts",                                                     # fontconfig (Chromium)
    "chromium", "chromium.d",                                    # /usr/bin/chromium's flags
)
SANDBOX_USER = "sandbox"
SANDBOX_HOSTNAME = "sandbox"
NSSWITCH = """\
passwd:     files
group:      files
shadow:     files
hosts:      files
networks:   files
protocols:  files
services:   files
ethers:     files
rpc:        files
"""


@dataclass(frozen=True)
class Entry:
    """One entry of the sandbox's /etc: a file (`data`), a link (`target`) or a directory."""

    path: str  # relative, POSIX
    kind: str  # "file" | "link" | "dir"
    data: bytes = b""
    target: str = ""


def _generated(uid: int, gid: int) -> list[Entry]:
    users = ["root:x:0:0:root:/root:/usr/sbin/nologin", f"{SANDBOX_USER}:x:{uid}:{gid}:{SANDBOX_USER}:{WORKDIR}:/bin/sh"]
    if uid != 65534:
        users.append("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin")
    groups = ["root:x:0:", f"{SANDBOX_USER}:x:{gid}:"]
    if gid != 65534:
        groups.append("nogroup:x:65534:")
    hosts = f"127.0.0.1\tlocalhost\n127.0.1.1\t{SANDBOX_HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    texts = {"passwd": "\n".join(users) + "\n", "group": "\n".join(groups) + "\n", "hosts": hosts,
             "hostname": SANDBOX_HOSTNAME + "\n", "nsswitch.conf": NSSWITCH}
    return [Entry(name, "file", data=text.encode()) for name, text in texts.items()]


def _link_allowed(link: Path, target: str, etc: Path, taken: tuple[str, ...]) -> bool:
    """Whether a link at `link` (under `etc`) to `target` ends in /usr or in what we copy."""
    resolved = os.path.normpath(os.path.join(os.path.dirname(link), target))
    if "/man/" in resolved:  # most of /etc/alternatives: manual pages, which no program opens
        return False
    if resolved == "/usr" or resolved.startswith("/usr/"):
        return True
    if not resolved.startswith(str(etc) + "/"):
        return False
    rel = resolved[len(str(etc)) + 1:]
    return any(rel == t or rel.startswith(t + "/") for t in taken)


def _host_entries(etc: Path = HOST_ETC, names: tuple[str, ...] = HOST_FILES) -> list[Entry]:
    """What of `names` under `etc` may be copied: world-readable files and directories, links
    that stay in /usr or in `names`; the directories leading to each."""
    entries: dict[str, Entry] = {}

    def add(path: Path) -> None:
        rel = path.relative_to(etc).as_posix()
        try:
            st = os.lstat(path)
        except OSError:
            return
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(path)
            if _link_allowed(path, target, etc, names):
                entries[rel] = Entry(rel, "link", target=target)
        elif stat.S_ISDIR(st.st_mode):
            if st.st_mode & 0o005 != 0o005:
                return
            entries[rel] = Entry(rel, "dir")
            for child in sorted(os.listdir(path)):
                add(path / child)
        elif stat.S_ISREG(st.st_mode) and st.st_mode & 0o004:
            try:
                entries[rel] = Entry(rel, "file", data=path.read_bytes())
            except OSError:
                return

    for name in names:
        path = etc / name
        if os.path.lexists(path):
            for parent in reversed(Path(name).parents[:-1]):  # "ssl" for "ssl/certs"
                entries.setdefault(parent.as_posix(), Entry(parent.as_posix(), "dir"))
            add(path)
    return list(entries.values())


def etc_entries(uid: int, gid: int, etc: Path = HOST_ETC) -> list[Entry]:
    """Every entry of the sandbox's /etc for the sandbox user `uid`:`gid`, sorted (parents first)."""
    generated = {e.path: e for e in _generated(uid, gid)}
    host = [e for e in _host_entries(etc) if e.path not in generated]
    return sorted([*host, *generated.values()], key=lambda e: e.path.split("/"))


def _digest(entries: list[Entry]) -> str:
    digest = hashlib.sha256()
    for e in entries:
        digest.update(b"%s\0%s\0%s\0%s\0" % (e.kind.encode(), e.path.encode(), e.target.encode(),
                                              hashlib.sha256(e.data).hexdigest().encode()))
    return digest.hexdigest()[:16]


def _write(directory: Path, entries: list[Entry]) -> None:
    for e in entries:
        path = directory / e.path
        if e.kind == "dir":
            path.mkdir(mode=0o755)
            path.chmod(0o755)  # whatever the umask
        elif e.kind == "link":
            os.symlink(e.target, path)
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as fh:
                fh.write(e.data)
            os.chmod(path, 0o644)
    directory.chmod(0o755)


_built: dict[tuple[str, int, int], Path] = {}
_entries: dict[tuple[int, int], list[Entry]] = {}
_lock = threading.Lock()


def sandbox_etc(root: Path, uid: int, gid: int) -> Path:
    """The sandbox /etc directory under `root` (SANDBOX_ROOT) for `uid`:`gid`, built if missing.

    Built in a fresh private directory under `root` and renamed to `etc-<digest>`: a concurrent
    builder (another worker) that got there first wins, and ours is removed. The host's files
    are read once per process."""
    key = (str(root), uid, gid)
    with _lock:
        path = _built.get(key)
        if path is not None and os.path.isdir(path):
            return path
        entries = _entries.get((uid, gid))
        if entries is None:
            entries = _entries[(uid, gid)] = etc_entries(uid, gid)
        path = root / f"etc-{_digest(entries)}"
        if not _is_ours(path):
            staging = Path(tempfile.mkdtemp(prefix=".etc-", dir=root))
            try:
                _write(staging, entries)
                try:
                    os.rename(staging, path)
                except OSError:
                    if not _is_ours(path):  # not a concurrent build's: a real failure
                        raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        _built[key] = path
        return path


def _is_ours(path: Path) -> bool:
    """A real directory (not a link) owned by this process's user: a finished build."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(f"{path} is not a directory this process built; remove it")
    return True
