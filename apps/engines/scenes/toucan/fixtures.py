"""A registered MCP server's fixtures: what its sandbox holds before the server starts.

    {"files": [{"path": "/workspace/notes.txt", "text": "..."}],
     "git_repo": {"path": "/workspace/repo", "commits": [{"message": "add README",
                  "files": [{"path": "README.md", "text": "..."}]}], "branches": ["dev"]},
     "pages": {"dir": "/workspace/site", "port": 8080,
               "files": [{"path": "index.html", "text": "<html>...</html>"}]}}

Every path is inside the sandbox's /workspace. The seed repository's commits have fixed
authors and dates, so their hashes are the same in every sandbox (answers and state checks can
name them). Pages are written by `install_fixtures` and served by `python3 -m http.server` on
127.0.0.1:port started just before the MCP server, in its own process tree (`with_pages`,
applied by the registry to the launch): only that server reaches them (the fetch server, with
--allow-private-ips), and the page server ends with it.
"""
from __future__ import annotations

import posixpath
import shlex
from typing import Any

from apps.engines.sandboxes import WORKDIR

FIXTURE_KINDS = ("files", "git_repo", "pages")
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "Toucan Fixture", "GIT_AUTHOR_EMAIL": "fixture@trajplatform.invalid",
                "GIT_COMMITTER_NAME": "Toucan Fixture", "GIT_COMMITTER_EMAIL": "fixture@trajplatform.invalid"}
FIXTURE_DATE = "2026-01-01T12:00:00+00:00"
SETUP_TIMEOUT_S = 60.0
PAGES_READY_TIMEOUT_S = 20.0
# Runs inside the sandbox: waits until the page server answers on its loopback port.
_WAIT_FOR_PORT = """
import socket, sys, time
deadline = time.monotonic() + float(sys.argv[2])
while True:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("nothing listens on 127.0.0.1:" + sys.argv[1])
        time.sleep(0.05)
"""
# sh -c _START_PAGES pages PORT DIR WAIT_CODE TIMEOUT ARGV...: the page server in the background
# (its log away from stdout, which may carry MCP), then ARGV once the port answers; absolute
# paths: a launch may hide node by a PATH without /usr/bin (mcp-server-fetch).
_START_PAGES = ('/usr/bin/python3 -m http.server "$1" --bind 127.0.0.1 --directory "$2" </dev/null >/dev/null 2>&1 & '
                '/usr/bin/python3 -c "$3" "$1" "$4" >&2 || exit 1; shift 4; exec "$@"')


class FixtureError(ValueError):
    """Fixtures that are malformed or could not be set up (the message names the field)."""


def _workspace_path(value: Any, what: str, *, base: str | None = None) -> str:
    if not isinstance(value, str) or not value or "\0" in value:
        raise FixtureError(f"{what} must be a non-empty path, got {value!r}")
    path = posixpath.normpath(posixpath.join(base, value) if base else value)
    if base and not value.startswith("/"):
        inside = path == base or path.startswith(base + "/")
    else:
        inside = path.startswith(WORKDIR + "/")
    if not inside:
        raise FixtureError(f"{what} must be inside {base or WORKDIR}, got {value!r}")
    return path


def _files(value: Any, what: str, *, base: str | None = None) -> list[tuple[str, str]]:
    if not isinstance(value, list):
        raise FixtureError(f"{what} must be a list of {{path, text}}, got {value!r}")
    files = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or set(item) != {"path", "text"} or not isinstance(item["text"], str):
            raise FixtureError(f"{what}[{i}] must be {{path, text}} with text a string, got {item!r}")
        files.append((_workspace_path(item["path"], f"{what}[{i}].path", base=base), item["text"]))
    return files


def validate_fixtures(fixtures: Any) -> dict[str, Any]:
    """The fixtures as given, checked (FixtureError names the first bad field)."""
    if fixtures is None:
        return {}
    if not isinstance(fixtures, dict):
        raise FixtureError(f"fixtures must be an object with {', '.join(FIXTURE_KINDS)}, got {fixtures!r}")
    unknown = sorted(set(fixtures) - set(FIXTURE_KINDS))
    if unknown:
        raise FixtureError(f"unknown fixtures {', '.join(unknown)} (known: {', '.join(FIXTURE_KINDS)})")
    if "files" in fixtures:
        _files(fixtures["files"], "fixtures.files")
    if "git_repo" in fixtures:
        repo = fixtures["git_repo"]
        if not isinstance(repo, dict) or set(repo) - {"path", "commits", "branches"} or "path" not in repo:
            raise FixtureError(f"fixtures.git_repo must be {{path, commits, branches}}, got {repo!r}")
        root = _workspace_path(repo["path"], "fixtures.git_repo.path")
        commits = repo.get("commits", [])
        if not isinstance(commits, list) or not commits:
            raise FixtureError("fixtures.git_repo.commits must be a non-empty list of {message, files}")
        for i, commit in enumerate(commits):
            if (not isinstance(commit, dict) or set(commit) != {"message", "files"}
                    or not isinstance(commit["message"], str) or not commit["message"].strip()):
                raise FixtureError(f"fixtures.git_repo.commits[{i}] must be {{message, files}}, got {commit!r}")
            _files(commit["files"], f"fixtures.git_repo.commits[{i}].files", base=root)
        branches = repo.get("branches", [])
        if not isinstance(branches, list) or not all(isinstance(b, str) and b and not b.startswith("-")
                                                     for b in branches):
            raise FixtureError(f"fixtures.git_repo.branches must be a list of branch names, got {branches!r}")
    if "pages" in fixtures:
        pages = fixtures["pages"]
        if not isinstance(pages, dict) or set(pages) != {"dir", "port", "files"}:
            raise FixtureError(f"fixtures.pages must be {{dir, port, files}}, got {pages!r}")
        root = _workspace_path(pages["dir"], "fixtures.pages.dir")
        port = pages["port"]
        if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port < 65536:
            raise FixtureError(f"fixtures.pages.port must be an integer in 1024..65535, got {port!r}")
        _files(pages["files"], "fixtures.pages.files", base=root)
    return fixtures


def install_fixtures(sandbox: Any, fixtures: dict[str, Any]) -> None:
    """Set the fixtures up inside `sandbox` (FixtureError with the command's output on failure)."""
    fixtures = validate_fixtures(fixtures)
    for path, text in _files(fixtures.get("files", []), "fixtures.files"):
        sandbox.write_file(path, text.encode())
    if "git_repo" in fixtures:
        _seed_repo(sandbox, fixtures["git_repo"])
    if "pages" in fixtures:
        _write_pages(sandbox, fixtures["pages"])


def _run(sandbox: Any, command: str | list[str], what: str, *, env: dict[str, str] | None = None) -> None:
    result = sandbox.run(command, timeout=SETUP_TIMEOUT_S, env=env)
    if result.exit_code != 0:
        raise FixtureError(f"{what} failed (exit {result.exit_code}): {(result.stderr or result.stdout).strip()[-2000:]}")


def _seed_repo(sandbox: Any, repo: dict[str, Any]) -> None:
    root = _workspace_path(repo["path"], "fixtures.git_repo.path")
    env = {**GIT_IDENTITY, "GIT_AUTHOR_DATE": FIXTURE_DATE, "GIT_COMMITTER_DATE": FIXTURE_DATE}
    _run(sandbox, f"git init -q -b main {shlex.quote(root)}", "git init of the seed repository", env=env)
    for i, commit in enumerate(repo["commits"]):
        paths = []
        for path, text in _files(commit["files"], f"fixtures.git_repo.commits[{i}].files", base=root):
            sandbox.write_file(path, text.encode())
            paths.append(posixpath.relpath(path, root))
        add = " ".join(shlex.quote(p) for p in paths)
        _run(sandbox, f"cd {shlex.quote(root)} && git add -- {add} && git commit -q -m {shlex.quote(commit['message'])}",
             f"commit {i} of the seed repository", env=env)
    for branch in repo.get("branches", []):
        _run(sandbox, f"git -C {shlex.quote(root)} branch -- {shlex.quote(branch)}", f"branch {branch!r}", env=env)


def _write_pages(sandbox: Any, pages: dict[str, Any]) -> None:
    root = _workspace_path(pages["dir"], "fixtures.pages.dir")
    for path, text in _files(pages["files"], "fixtures.pages.files", base=root):
        sandbox.write_file(path, text.encode())


def with_pages(argv: list[str], fixtures: dict[str, Any]) -> list[str]:
    """`argv` started after a page server on 127.0.0.1:port when the fixtures have pages.

    The page server runs in the MCP server's own process tree: locally each stdio server
    process has a network namespace of its own (a loopback nobody else reaches), so pages
    served by another command of the sandbox would not be reachable from it."""
    pages = fixtures.get("pages")
    if not pages:
        return list(argv)
    root = _workspace_path(pages["dir"], "fixtures.pages.dir")
    return ["/bin/sh", "-c", _START_PAGES, "pages", str(pages["port"]), root, _WAIT_FOR_PORT,
            str(PAGES_READY_TIMEOUT_S), *argv]
