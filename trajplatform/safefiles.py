"""Writing files where a user points, without writing through a link someone planted there.

Commands and jobs write next to a path the user gave (`dataset_export --out`, corpus builds):
`<path>.tmp`, `<path>.parts/`, `<stem>_images/`. Anyone who can write in that directory (a
shared /tmp, a group-writable export folder) can plant a symlink at one of those names before
the run, and a plain `open(name, "wb")` then truncates and overwrites the link's target with
the platform's privileges. Everything here refuses to follow a link:

- `open_exclusive(path)` creates a new file (O_CREAT|O_EXCL|O_NOFOLLOW): an existing entry of
  any kind, a link included, is an error, never opened.
- `atomic_output(path, force=...)` writes a fresh `<path>.tmp` (a stale one, or a link planted
  at that name, is removed first: unlinking a link never touches its target), fsyncs it and
  renames it onto `path` (the rename replaces the directory entry, so a link at `path` is
  replaced, not followed). Without force an existing `path` is refused, atomically where the
  filesystem has hard links. On an error the temporary file is removed and `path` is untouched.
- `private_directory(path)` makes (or accepts) a directory that is a real directory owned by
  this process's user, so no one else can plant entries inside it.
- `open_regular(path)` opens an existing regular file for reading, never through a link.

`UnsafePathError` (an OSError) names the path and what was found there.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import IO, Any, Iterator

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Filesystems without hard links (some FUSE, SMB, FAT mounts) answer link() with these.
_NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS, errno.EXDEV}


class UnsafePathError(OSError):
    """A path the platform was to write or read is a link, not a regular file/directory, or not ours."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a file"
    return "a special file"


def open_exclusive(path: str | os.PathLike[str], mode: str = "wb", *, perms: int = 0o666,
                   encoding: str | None = None) -> IO[Any]:
    """A new file at `path`, opened for writing (FileExistsError if anything, a link included,
    is there). `perms` is filtered by the umask, as open() does."""
    if "w" not in mode or "+" in mode:
        raise ValueError(f"open_exclusive writes new files; mode {mode!r}")
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, perms)
    try:
        return os.fdopen(fd, mode, encoding=encoding if "b" not in mode else None)
    except BaseException:
        os.close(fd)
        raise


def remove_stale(path: str | os.PathLike[str]) -> None:
    """Remove a leftover file or link at `path` (our temporary name); refuse a directory or device."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise UnsafePathError(errno.EEXIST, f"{os.fspath(path)} is {_kind(st.st_mode)}; remove it and retry")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform/filesystem lets a directory be fsynced
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _publish(tmp: Path, path: Path, *, force: bool) -> None:
    if force:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path, follow_symlinks=False)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, f"{path} already exists") from None
    except OSError as exc:
        if exc.errno not in _NO_LINKS:
            raise
        if os.path.lexists(path):  # no hard links here: a check, then the rename
            raise FileExistsError(errno.EEXIST, f"{path} already exists") from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], *, force: bool, mode: str = "wb", perms: int = 0o666,
                  encoding: str | None = None, tmp: str | os.PathLike[str] | None = None) -> Iterator[IO[Any]]:
    """Write `path` through a new temporary file in its directory (`<path>.tmp` unless `tmp`),
    put in place by rename when the block exits cleanly. An existing `path` is refused
    (FileExistsError) unless force; a directory at `path` always is. On any error the temporary
    file is removed and `path` keeps what it held."""
    path = Path(path)
    tmp_path = Path(tmp) if tmp is not None else path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            raise UnsafePathError(errno.EISDIR, f"{path} is a directory; give a file path")
        if not force:
            raise FileExistsError(errno.EEXIST, f"{path} already exists")
    remove_stale(tmp_path)
    try:
        fh = open_exclusive(tmp_path, mode, perms=perms, encoding=encoding)
    except FileExistsError:  # re-created between our unlink and our open: someone is racing us
        raise UnsafePathError(errno.EEXIST, f"{tmp_path} appeared while it was being created; "
                                            "is another process writing here?") from None
    published = False
    try:
        with fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        _publish(tmp_path, path, force=force)
        published = True
        _fsync_directory(path.parent)
    finally:
        if not published:
            with contextlib.suppress(OSError):
                os.unlink(tmp_path)


def private_directory(path: str | os.PathLike[str], *, parents: bool = False) -> Path:
    """`path` as a directory only this process's user can have filled: created if missing (mode
    0o777 & ~umask); an existing one must be a real directory (not a link) owned by us."""
    path = Path(path)
    with contextlib.suppress(FileExistsError):
        path.mkdir(parents=parents)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(errno.ENOTDIR, f"{path} is {_kind(st.st_mode)}, not a directory; remove it and retry")
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise UnsafePathError(errno.EPERM, f"{path} belongs to uid {st.st_uid}, not to this process's user "
                                           f"(uid {os.geteuid()}); remove it and retry")
    return path


def open_regular(path: str | os.PathLike[str]) -> IO[bytes]:
    """An existing regular file opened for reading in binary, never through a symbolic link."""
    try:
        # O_NONBLOCK: opening a FIFO planted at the name must not wait for a writer.
        fd = os.open(os.fspath(path), os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(errno.ELOOP, f"{os.fspath(path)} is a symbolic link") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePathError(errno.EINVAL, f"{os.fspath(path)} is {_kind(st.st_mode)}, not a file")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")
