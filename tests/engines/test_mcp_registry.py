"""The MCP server registry (apps/engines/mcp_servers.py): the bundled servers registered from
examples/toucan/*.json by their real tools/list in a local bubblewrap sandbox (profile
trajplatform-mcp), then called through the hub; secrets, bad records, the command, the admin.
"""
from __future__ import annotations

import copy
import re
import json
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from apps.engines.mcp import McpHub
from apps.engines.models import McpServer
from apps.engines.sandboxes import PLATFORM_MCP_PROFILE, SandboxSpec
from apps.engines.sandboxes.local import platform_mcp_packages
from apps.engines.scenes.toucan.fixtures import install_fixtures
from apps.engines.mcp_servers import (
    McpRegistryError,
    hub_spec,
    load_records,
    mcp_server_register,
    mcp_server_resnapshot,
    mcp_server_set_enabled,
    mcp_servers_register,
    parse_record,
    tools_sha256,
)
from trajplatform.audit import AuditEvent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings")]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "toucan"
BUNDLED = {r["name"]: r for r in load_records(EXAMPLES / "servers.json")}
NPM = {r["name"]: r for r in load_records(EXAMPLES / "servers-npm.json")}
NPM_INSTALLED = (Path(platform_mcp_packages()) / "node" / "node_modules" / ".bin").is_dir()
TOOLS = {
    "time": ["get_current_time", "convert_time"],
    "git": ["git_status", "git_diff_unstaged", "git_diff_staged", "git_diff", "git_commit", "git_add", "git_reset",
            "git_log", "git_create_branch", "git_checkout", "git_show", "git_branch"],
    "fetch": ["fetch"],
    "sqlite": ["list_tables", "describe_table", "read_query", "write_query", "create_table"],
    "memory": ["create_entities", "create_relations", "add_observations", "delete_entities", "delete_observations",
               "delete_relations", "read_graph", "search_nodes", "open_nodes"],
    "filesystem": ["read_file", "read_text_file", "read_media_file", "read_multiple_files", "write_file", "edit_file",
                   "create_directory", "list_directory", "list_directory_with_sizes", "directory_tree", "move_file",
                   "search_files", "get_file_info", "list_allowed_directories"],
}


def in_episode(server: McpServer, local_backend: Any, check: Any) -> float:
    """Start the registered server as an episode would (fixtures, hub_spec) and run `check(hub,
    sandbox)`; returns the start time (spawn + initialize + tools/list) in seconds."""
    with local_backend.create(SandboxSpec(image=PLATFORM_MCP_PROFILE)) as sandbox:
        install_fixtures(sandbox, server.fixtures)
        hub = McpHub([hub_spec(server)])
        started = time.monotonic()
        hub.start(sandbox, lifetime=300)
        seconds = time.monotonic() - started
        check(hub, sandbox)
        return seconds


def check_time(hub: McpHub, sandbox: Any) -> None:
    # UTC and Asia/Tokyo have no daylight saving: the answer is the same on every day.
    result = hub.call_tool("time__convert_time", {"source_timezone": "UTC", "time": "12:00",
                                                  "target_timezone": "Asia/Tokyo"})
    answer = json.loads(result.output)
    assert answer["target"]["datetime"][11:16] == "21:00" and answer["time_difference"] == "+9.0h"
    assert result.extra["is_error"] is False
    refused = hub.call_tool("time__convert_time", {"source_timezone": "Mars/Olympus", "time": "12:00",
                                                   "target_timezone": "UTC"})
    assert refused.extra["is_error"] is True and "Mars/Olympus" in refused.output


def check_git(hub: McpHub, sandbox: Any) -> None:
    status = hub.call_tool("git__git_status", {"repo_path": "/workspace/repo"})
    assert "On branch main" in status.output and "nothing to commit" in status.output
    log = hub.call_tool("git__git_log", {"repo_path": "/workspace/repo"}).output
    assert log.index("document usage") < log.index("add inventory module") < log.index("add README")
    hub.call_tool("git__git_create_branch", {"repo_path": "/workspace/repo", "branch_name": "release-1"})
    # The state, read by the record's state probe: the branch is there, on the latest commit.
    probe = sandbox.run(McpServer.objects.get(name="git").state_probe["command"], timeout=30)
    latest = probe.stdout.splitlines()[0]
    assert "release-1" in latest and latest.endswith("document usage")


def check_fetch(hub: McpHub, sandbox: Any) -> None:
    page = hub.call_tool("fetch__fetch", {"url": "http://127.0.0.1:8080/events.html"}, timeout=60)
    assert page.extra["is_error"] is False, page.output
    assert "Reading club: every Tuesday at 17:30" in page.output
    missing = hub.call_tool("fetch__fetch", {"url": "http://127.0.0.1:8080/nope.html"}, timeout=60)
    assert missing.extra["is_error"] is True and "404" in missing.output


def check_sqlite(hub: McpHub, sandbox: Any) -> None:
    wrote = hub.call_tool("sqlite__write_query", {"query": "INSERT INTO products (name, price_cents, stock) "
                                                            "VALUES ('mirror', 1250, 7)"})
    assert json.loads(wrote.output) == {"affected_rows": 1}
    rows = json.loads(hub.call_tool("sqlite__read_query", {"query": "SELECT name, stock FROM products "
                                                                      "WHERE stock > 0 ORDER BY name"}).output)
    assert rows == [{"name": "lamp", "stock": 3}, {"name": "lens", "stock": 12}, {"name": "mirror", "stock": 7}]
    refused = hub.call_tool("sqlite__read_query", {"query": "DELETE FROM products"})
    assert refused.extra["is_error"] is True and "SELECT" in refused.output
    sneaky = hub.call_tool("sqlite__read_query", {"query": "WITH x AS (SELECT 1) DELETE FROM products"})
    assert sneaky.extra["is_error"] is True and "readonly" in sneaky.output
    probe = sandbox.run(McpServer.objects.get(name="sqlite").state_probe["command"], timeout=30)
    assert "INSERT INTO \"products\" VALUES(4,'mirror',1250,7);" in probe.stdout


def check_memory(hub: McpHub, sandbox: Any) -> None:
    hub.call_tool("memory__create_entities", {"entities": [{"name": "Ada", "entityType": "person",
                                                            "observations": ["likes lamps"]}]})
    graph = json.loads(hub.call_platform("memory", "read_graph", {}).text)
    assert graph["entities"][0]["name"] == "Ada"


def check_filesystem(hub: McpHub, sandbox: Any) -> None:
    text = hub.call_tool("filesystem__read_text_file", {"path": "/workspace/files/todo.txt"}).output
    assert "order lenses" in text
    outside = hub.call_tool("filesystem__read_text_file", {"path": "/workspace/data.db"})
    assert outside.extra["is_error"] is True


CHECKS = {"time": check_time, "git": check_git, "fetch": check_fetch, "sqlite": check_sqlite,
          "memory": check_memory, "filesystem": check_filesystem}


@pytest.mark.parametrize("name", [*BUNDLED, *NPM])
def test_each_bundled_server_registers_with_its_real_tools_and_answers_through_the_hub(
        name: str, local_backend: Any, admin_user: Any) -> None:
    # make install installs the npm servers wherever npm exists (CI's machines have it): a missing
    # install is a failure here, not a skip.
    assert name not in NPM or NPM_INSTALLED, "the npm MCP servers are not installed: run `make install` with npm present"
    record = (BUNDLED | NPM)[name]
    result = mcp_server_register(data=record, actor=admin_user)
    server = McpServer.objects.get(name=name)
    assert result.created and result.server == server
    assert [t["name"] for t in server.tools] == TOOLS[name]
    assert all(t["description"] and t["input_schema"]["type"] == "object" for t in server.tools)
    assert server.tools_sha256 == tools_sha256(server.tools) and server.snapshot_start_ms > 0
    assert server.package == record["package"] and server.enabled
    (event,) = AuditEvent.objects.filter(action="engines.mcp_server_register", target_id=str(server.pk))
    assert event.actor == admin_user and event.data["created"] is True
    assert event.data["tools_sha256"] == server.tools_sha256 and event.data["tools"] == len(TOOLS[name])
    seconds = in_episode(server, local_backend, CHECKS[name])
    print(f"\n{name}: registration start {server.snapshot_start_ms} ms, episode start {seconds * 1000:.0f} ms")


def test_re_registering_updates_the_row_and_a_changed_snapshot_is_recorded(admin_user: Any) -> None:
    first = mcp_server_register(data=BUNDLED["time"], actor=admin_user)
    relabelled = {**BUNDLED["time"], "labels": {"primary": "Time & Calendar", "secondary": []}}
    again = mcp_server_register(data=relabelled, actor=admin_user)
    assert not again.created and not again.tools_changed and again.previous_sha256 == first.snapshot.sha256
    server = McpServer.objects.get(name="time")
    assert server.labels["secondary"] == [] and McpServer.objects.count() == 1
    # An older snapshot (the package changed since): re-snapshotting records both hashes.
    McpServer.objects.filter(pk=server.pk).update(tools=server.tools[:1], tools_sha256="0" * 64)
    server.refresh_from_db()
    redone = mcp_server_resnapshot(server=server, actor=admin_user)
    assert redone.tools_changed and len(McpServer.objects.get(pk=server.pk).tools) == 2
    events = list(AuditEvent.objects.filter(target_id=str(server.pk)).order_by("id"))
    assert [e.action for e in events] == ["engines.mcp_server_register", "engines.mcp_server_register",
                                          "engines.mcp_server_resnapshot"]
    assert events[1].data["fields_changed"] == ["labels"] and events[1].data["tools_changed"] is False
    assert events[2].data == {**events[2].data, "previous_tools_sha256": "0" * 64, "tools_changed": True,
                              "tools_sha256": first.snapshot.sha256}


@pytest.mark.parametrize("launch, where", [
    ({"env": {"SMITHERY_API_KEY": "c2b6f8e1-4d1a-4f0e-9a77-3f3c2d1e0b9a"}}, "env.SMITHERY_API_KEY"),
    ({"env": {"OPENAI": "sk-proj-abcdefghijklmnopqrstuvwx"}}, "env.OPENAI"),
    ({"argv": ["python3", "-m", "mcp_server_time", "--api-key", "hunter2hunter2"]}, "argv[4]"),
    ({"argv": ["python3", "-m", "mcp_server_time", "--token=abcdefghijkl"]}, "argv[3]"),
    ({"argv": ["python3", "-m", "x", "https://user:pa55word@example.com/mcp"]}, "argv[3]"),
    ({"argv": ["python3", "-m", "x", "https://example.com/mcp?api_key=abcdef123456"]}, "argv[3]"),
])
def test_a_literal_secret_in_a_launch_is_refused_and_nothing_is_written(launch: dict[str, Any], where: str) -> None:
    record = copy.deepcopy(BUNDLED["time"])
    record["launch"].update(launch)
    with pytest.raises(McpRegistryError, match=rf"launch {re.escape(where)} holds what looks like a literal secret"):
        mcp_server_register(data=record, actor=None)
    assert not McpServer.objects.exists() and not AuditEvent.objects.exists()


def test_a_secret_is_stored_as_a_reference_and_filled_in_only_for_the_hub(monkeypatch: Any) -> None:
    record = copy.deepcopy(BUNDLED["time"])
    record["launch"]["env"]["TIME_API_KEY"] = "${TOUCAN_TEST_TIME_KEY}"
    with pytest.raises(McpRegistryError, match=r"refers to the secret \$\{TOUCAN_TEST_TIME_KEY\}, which `secrets`"):
        parse_record(record)
    record["secrets"] = ["TOUCAN_TEST_TIME_KEY"]
    with pytest.raises(McpRegistryError, match="needs the secret TOUCAN_TEST_TIME_KEY, which is not set"):
        mcp_server_register(data=record, actor=None)
    value = "f3a9c1d27be84e6a"
    monkeypatch.setenv("TOUCAN_TEST_TIME_KEY", value)
    server = mcp_server_register(data=record, actor=None).server
    server.refresh_from_db()
    assert server.spec["env"]["TIME_API_KEY"] == "${TOUCAN_TEST_TIME_KEY}" and server.secrets == ["TOUCAN_TEST_TIME_KEY"]
    stored = json.dumps([server.spec, list(AuditEvent.objects.values_list("data", flat=True))])
    assert value not in stored
    assert hub_spec(server).env["TIME_API_KEY"] == value


def test_a_bad_record_in_a_file_is_reported_and_nothing_is_written(tmp_path: Path, capsys: Any) -> None:
    bad_name = {**BUNDLED["sqlite"], "name": "a__b"}
    unknown_tool = {**BUNDLED["time"], "name": "time2", "deny_tools": ["set_time"]}
    bad_rank = {**BUNDLED["git"], "name": "git2", "labels": {"primary": "Dev", "rank": 0, "featured": "yes"}}
    path = tmp_path / "servers.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (BUNDLED["time"], bad_name, {"name": "x"}, bad_rank)) + "\n")
    with pytest.raises(CommandError, match=r"4 problem\(s\); nothing was registered"):
        call_command("mcp_register", str(path))
    err = capsys.readouterr().err
    assert "record 2 ('a__b'): name must be" in err
    assert "record 4 ('git2'): labels must be" in err
    assert "record 3 ('x'): package is required" in err and "record 3 ('x'): launch is required" in err
    # Checked in the sandbox: a deny list naming a tool the server does not have.
    path.write_text(json.dumps([BUNDLED["time"], unknown_tool]))
    with pytest.raises(CommandError, match=r"1 problem\(s\)"):
        call_command("mcp_register", str(path))
    assert "time2: deny_tools names set_time, which the server does not offer" in capsys.readouterr().err
    assert not McpServer.objects.exists() and not AuditEvent.objects.exists()


def test_a_server_that_needs_egress_is_refused_by_the_local_backend_and_nothing_is_written(tmp_path: Path,
                                                                                        capsys: Any) -> None:
    online = {**BUNDLED["time"], "name": "online", "launch": {**BUNDLED["time"]["launch"], "network": "egress"}}
    path = tmp_path / "servers.json"
    path.write_text(json.dumps([online]))
    with pytest.raises(CommandError, match=r"1 problem\(s\)"):
        call_command("mcp_register", str(path))
    assert "only network='none'" in capsys.readouterr().err
    assert not McpServer.objects.exists() and not AuditEvent.objects.exists()


def test_a_file_that_is_not_json_is_reported_by_line(tmp_path: Path) -> None:
    path = tmp_path / "servers.jsonl"
    path.write_text(json.dumps(BUNDLED["time"]) + "\n{oops\n")
    with pytest.raises(CommandError, match=r"1 problem\(s\)"):
        call_command("mcp_register", str(path))
    with pytest.raises(McpRegistryError, match=r"servers.jsonl, line 2: not JSON"):
        load_records(path)
    with pytest.raises(CommandError, match="no such file"):
        call_command("mcp_register", str(tmp_path / "missing.json"))
    assert not McpServer.objects.exists()


def test_the_command_registers_a_file_and_a_dry_run_writes_nothing(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"servers": [BUNDLED["time"], BUNDLED["sqlite"]]}))
    call_command("mcp_register", str(path), "--dry-run")
    out = capsys.readouterr().out
    assert "time: 2 tools" in out and "sqlite: 5 tools" in out and "dry run: nothing written" in out
    assert not McpServer.objects.exists() and not AuditEvent.objects.exists()
    call_command("mcp_register", str(path))
    assert "registered 2 MCP server(s)" in capsys.readouterr().out
    assert sorted(McpServer.objects.values_list("name", flat=True)) == ["sqlite", "time"]
    assert set(AuditEvent.objects.values_list("actor_repr", flat=True)) == {"manage.py mcp_register"}


def test_the_mcp_profile_binds_the_servers_read_only_with_git(local_backend: Any) -> None:
    with local_backend.create(SandboxSpec(image=PLATFORM_MCP_PROFILE)) as sandbox:
        imports = sandbox.run(["python3", "-c", "import mcp_server_git, mcp_server_fetch, mcp_server_time, sqlite_server, "
                                                "fastmcp; print(mcp_server_git.__file__)"], timeout=60)
        assert imports.exit_code == 0, imports.stderr
        assert imports.stdout.startswith("/opt/trajplatform/mcp/python/mcp_server_git/")
        for target in ("/opt/trajplatform/mcp/python/x", "/opt/trajplatform/mcp-builtin/x",
                       "/opt/trajplatform/site-packages/x"):
            denied = sandbox.run(["touch", target], timeout=30)
            assert denied.exit_code != 0 and "Read-only file system" in denied.stderr
        assert sandbox.run(["git", "--version"], timeout=30).stdout.startswith("git version")


def test_the_profile_without_the_mcp_packages_is_a_clear_error(settings: Any, tmp_path: Path) -> None:
    settings.SANDBOX_MCP_PACKAGES = str(tmp_path)
    with pytest.raises(McpRegistryError, match=r"time: .*needs the bundled MCP servers' packages.*run `make install`"):
        mcp_server_register(data=BUNDLED["time"], actor=None)
    assert not McpServer.objects.exists()


def test_the_admin_shows_the_snapshot_and_changes_only_through_the_services(admin_client: Any, admin_user: Any) -> None:
    server = mcp_server_register(data=BUNDLED["sqlite"], actor=admin_user).server
    page = admin_client.get(reverse("admin:engines_mcpserver_change", args=[server.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert "<code>write_query</code>" in html and "Run one INSERT, UPDATE or DELETE statement" in html
    assert server.tools_sha256 in html and 'name="_save"' not in html
    # A POST to the change page cannot edit the row.
    refused = admin_client.post(reverse("admin:engines_mcpserver_change", args=[server.pk]), {"enabled": ""})
    assert refused.status_code == 403 and McpServer.objects.get(pk=server.pk).enabled
    changelist = reverse("admin:engines_mcpserver_changelist")
    listing = admin_client.get(changelist).content.decode()
    assert "module: sqlite_server 1" in listing and server.tools_sha256[:12] in listing
    assert admin_client.get(reverse("admin:engines_mcpserver_add")).status_code == 403
    admin_client.post(changelist, {"action": "disable_selected", "_selected_action": [server.pk]})
    assert McpServer.objects.get(pk=server.pk).enabled is False
    admin_client.post(changelist, {"action": "resnapshot_selected", "_selected_action": [server.pk]})
    actions = list(AuditEvent.objects.filter(target_id=str(server.pk)).order_by("id").values_list("action", flat=True))
    assert actions == ["engines.mcp_server_register", "engines.mcp_server_set_enabled", "engines.mcp_server_resnapshot"]
    mcp_server_set_enabled(server=server, enabled=False, actor=admin_user)  # a repeat: no audit row
    assert AuditEvent.objects.filter(action="engines.mcp_server_set_enabled").count() == 1
