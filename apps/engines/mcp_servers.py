"""The MCP server registry: records validated, tools snapshotted in a sandbox, rows written with audit;
and the registered servers as the toucan scene's episodes read them (`install`, from EnginesConfig.ready).

    results = mcp_servers_register(records=load_records("examples/toucan/servers.json"), actor=user)
    mcp_server_resnapshot(server=McpServer.objects.get(name="git"), actor=user)
    mcp_server_set_enabled(server=server, enabled=False, actor=user)
    spec = hub_spec(server)          # the McpServerSpec an episode's McpHub starts (secrets filled in)

A record (JSON; `manage.py mcp_register FILE` takes a list, {"servers": [...]}, one object or JSONL):

    {"name": "git",
     "package": {"kind": "pypi" | "npm" | "module", "name": "mcp-server-git", "version": "2026.10.19"},
     "launch": {"argv": [...], "env": {...}, "cwd": null, "transport": "stdio", ...},  # McpServerSpec fields
     "deny_tools": [], "labels": {"primary": "...", "secondary": ["..."]},
     "secrets": ["SMITHERY_API_KEY"],          # names of env vars / settings, never values
     "fixtures": {...},                         # fixtures.py
     "state_probe": {"command": [...]} | {"tool": "read_graph", "arguments": {}} | null,
     "enabled": true}

Secrets: the launch names a secret only as `${NAME}` (NAME listed in `secrets`), filled in from
the environment or a setting of that name when a sandbox starts the server (`hub_spec`). A
launch holding anything that looks like a secret itself (a key shape, a configured secret's
value, a literal value of an env var or flag named like a secret, credentials in a URL) is
refused: the registry never stores one.

Registration starts each server in a sandbox of the trajplatform-mcp profile with its fixtures
set up, through the MCP hub: its own tools/list is the snapshot (name, description,
input_schema per tool; `tools_sha256` is the SHA-256 of the canonical JSON), the names in
deny_tools / allow_tools / platform_tools and a tool probe must be among its tools, and the
state probe must run. Every record of a call is checked and snapshotted before anything is
written; one bad record writes nothing. Re-registering a name updates the row and its audit
row records the previous and new hash.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from apps.engines.mcp import McpHub, McpServerSpec, McpSpecError, McpStartError
from apps.engines.mcp.session import McpSessionError
from apps.engines.models import McpServer
from apps.engines.runtime import SetupError, ToolError
from apps.engines.sandboxes import PLATFORM_MCP_PROFILE, SandboxError, SandboxSpec, get_backend
from apps.engines.scenes.toucan.fixtures import FixtureError, install_fixtures, validate_fixtures, with_pages
from apps.engines.scenes.toucan.runtime import Server, install_server_reader
from trajplatform.audit import audit_record
from trajplatform.redaction import redact, storable

# Toucan's server labels: primary/secondary category, whether it is featured, its usage rank (for
# power-law sampling) and a one-line description for the question prompts.
LABEL_FIELDS = frozenset({"primary", "secondary", "featured", "rank", "description"})
RECORD_FIELDS = ("name", "package", "launch", "deny_tools", "labels", "secrets", "fixtures", "state_probe", "enabled")
# The record's own fields; the rest of McpServerSpec is its `launch`.
SPEC_FROM_RECORD = ("name", "package", "deny_tools")
LAUNCH_FIELDS = tuple(f.name for f in fields(McpServerSpec) if f.name not in SPEC_FROM_RECORD)
SECRET_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
SECRET_REF_RE = re.compile(r"\$\{([^}]*)\}")
SNAPSHOT_LIFETIME_S = 600.0
PROBE_TIMEOUT_S = 60.0


class McpRegistryError(ValueError):
    """Records that cannot be registered; `errors` lists one message per problem."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("; ".join(self.errors))


@dataclass
class ServerRecord:
    """A validated record: the hub's spec (secrets still as references) and the registry's fields."""

    spec: McpServerSpec
    labels: dict[str, Any]
    secrets: list[str]
    fixtures: dict[str, Any]
    state_probe: dict[str, Any] | None
    enabled: bool

    @property
    def name(self) -> str:
        return self.spec.name

    @classmethod
    def of(cls, server: McpServer) -> "ServerRecord":
        return cls(spec=McpServerSpec.from_dict(server.spec), labels=server.labels, secrets=list(server.secrets),
                   fixtures=server.fixtures, state_probe=server.state_probe, enabled=server.enabled)


@dataclass
class Snapshot:
    tools: list[dict[str, Any]]
    sha256: str
    start_ms: int


@dataclass
class Registered:
    """One record's outcome (server is None on a dry run)."""

    name: str
    snapshot: Snapshot
    created: bool
    previous_sha256: str
    server: McpServer | None = None

    @property
    def tools_changed(self) -> bool:
        return not self.created and self.previous_sha256 != self.snapshot.sha256


# --- reading and checking records ----------------------------------------------------------------


def load_records(path: str | Path) -> list[Any]:
    """The records of a JSON file (a list, {"servers": [...]} or one object) or a JSONL file."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as whole_error:
        records = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                if number == 1:
                    raise McpRegistryError([f"{path}: not JSON: {whole_error}"]) from None
                raise McpRegistryError([f"{path}, line {number}: not JSON: {exc}"]) from None
        return records
    if isinstance(data, dict) and "servers" in data and set(data) == {"servers"}:
        data = data["servers"]
    return data if isinstance(data, list) else [data]


def parse_record(data: Any) -> ServerRecord:
    """A checked record (McpRegistryError listing every problem found)."""
    if not isinstance(data, dict):
        raise McpRegistryError([f"a server record must be an object, got {type(data).__name__}"])
    errors: list[str] = []
    unknown = sorted(set(data) - set(RECORD_FIELDS))
    if unknown:
        errors.append(f"unknown fields {', '.join(unknown)} (a record has {', '.join(RECORD_FIELDS)})")
    for required in ("name", "package", "launch"):
        if required not in data:
            errors.append(f"{required} is required")
    package = data.get("package")
    if isinstance(package, dict) and not all(isinstance(package.get(k), str) and package.get(k)
                                             for k in ("kind", "name", "version")):
        errors.append(f"package needs kind, name and version, got {package!r}")
    launch = data.get("launch", {})
    if not isinstance(launch, dict):
        errors.append(f"launch must be an object of {', '.join(LAUNCH_FIELDS)}, got {launch!r}")
        launch = {}
    wrong = sorted(set(launch) - set(LAUNCH_FIELDS))
    if wrong:
        errors.append(f"launch has unknown fields {', '.join(wrong)} (it has {', '.join(LAUNCH_FIELDS)})")
    secrets = data.get("secrets", [])
    if not isinstance(secrets, list) or not all(isinstance(s, str) and SECRET_NAME_RE.match(s) for s in secrets):
        errors.append(f"secrets must be a list of env var / setting names, got {secrets!r}")
        secrets = []
    labels = data.get("labels", {})
    rank = labels.get("rank") if isinstance(labels, dict) else None
    if not isinstance(labels, dict) or set(labels) - LABEL_FIELDS \
            or not isinstance(labels.get("primary", ""), str) \
            or not (isinstance(labels.get("secondary", []), list)
                    and all(isinstance(s, str) for s in labels.get("secondary", []))) \
            or not isinstance(labels.get("featured", False), bool) \
            or not (rank is None or (isinstance(rank, int) and not isinstance(rank, bool) and rank >= 1)) \
            or not isinstance(labels.get("description", ""), str):
        errors.append(f'labels must be {{"primary": str, "secondary": [str], "featured": bool, "rank": int >= 1 '
                      f'(usage rank, 1 = most used), "description": str}} (all optional), got {labels!r}')
    probe = data.get("state_probe")
    if probe is not None and not _probe_ok(probe):
        errors.append(f'state_probe must be null, {{"command": [str, ...]}} or {{"tool": str, "arguments": {{}}}}, '
                      f"got {probe!r}")
    if not isinstance(data.get("enabled", True), bool):
        errors.append(f"enabled must be true or false, got {data.get('enabled')!r}")
    try:
        validate_fixtures(data.get("fixtures"))
    except FixtureError as exc:
        errors.append(str(exc))
    spec = None
    if not errors:
        try:
            spec = McpServerSpec.from_dict({**launch, **{k: data[k] for k in SPEC_FROM_RECORD if k in data}})
        except (McpSpecError, TypeError) as exc:
            errors.append(str(exc))
    if spec is not None:
        errors += _secret_problems(spec, secrets)
    if errors:
        raise McpRegistryError(errors)
    return ServerRecord(spec=spec, labels=labels, secrets=list(secrets), fixtures=data.get("fixtures") or {},
                        state_probe=probe, enabled=data.get("enabled", True))


def _probe_ok(probe: Any) -> bool:
    if not isinstance(probe, dict):
        return False
    if set(probe) == {"command"}:
        command = probe["command"]
        return isinstance(command, list) and bool(command) and all(isinstance(a, str) for a in command)
    return (set(probe) in ({"tool"}, {"tool", "arguments"}) and isinstance(probe["tool"], str)
            and isinstance(probe.get("arguments", {}), dict))


def _secret_problems(spec: McpServerSpec, secrets: list[str]) -> list[str]:
    """Why the launch cannot be stored: undeclared references, literal secrets (by field)."""
    problems = []
    strings = {f"argv[{i}]": a for i, a in enumerate(spec.argv)}
    strings.update({f"http_argv[{i}]": a for i, a in enumerate(spec.http_argv or [])})
    strings.update({f"env.{k}": v for k, v in spec.env.items()})
    if spec.cwd:
        strings["cwd"] = spec.cwd
    for where, value in strings.items():
        for name in SECRET_REF_RE.findall(value):
            if name not in secrets:
                problems.append(f"launch {where} refers to the secret ${{{name}}}, which `secrets` does not list")
    blank = {where: SECRET_REF_RE.sub("", value) for where, value in strings.items()}
    # An env var or a flag named like a secret holds nothing but references; redact() also
    # knows key shapes (sk-…, ghp_…, Bearer …), configured secrets' values and URL credentials.
    pairs: dict[str, dict[str, str]] = {f"env.{k}": {k: blank[f"env.{k}"]} for k in spec.env}
    for prefix, argv in (("argv", spec.argv), ("http_argv", spec.http_argv or [])):
        for i, arg in enumerate(argv):
            where = f"{prefix}[{i}]"
            if arg.startswith("-") and "=" in arg:
                flag, value = blank[where].split("=", 1)
                pairs[where] = {flag.lstrip("-"): value}
            elif i and argv[i - 1].startswith("-") and "=" not in argv[i - 1]:
                pairs[where] = {argv[i - 1].lstrip("-"): blank[where]}
    for where, value in blank.items():
        if redact(value) != value or redact(pairs.get(where, {})) != pairs.get(where, {}):
            problems.append(f"launch {where} holds what looks like a literal secret; list its name in `secrets` "
                            f"and write ${{NAME}} instead (the registry never stores secret values)")
    return problems


# --- the snapshot ----------------------------------------------------------------------------


def resolved_spec(spec: McpServerSpec, secrets: list[str], fixtures: dict[str, Any]) -> McpServerSpec:
    """`spec` as a sandbox launches it: its ${NAME} references filled in from the environment or
    settings, after the fixtures' page server when they have pages (fixtures.with_pages)."""
    def fill(value: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            found = (os.environ.get(name) or getattr(settings, name, None)) if name in secrets else None
            if not isinstance(found, str) or not found:
                raise McpRegistryError([f"the MCP server {spec.name!r} needs the secret {name}, which is not set "
                                        "(an environment variable or setting of that name)"])
            return found
        return SECRET_REF_RE.sub(one, value)

    data = spec.to_dict()
    data["argv"] = with_pages([fill(a) for a in spec.argv], fixtures)
    data["http_argv"] = with_pages([fill(a) for a in spec.http_argv], fixtures) if spec.http_argv else None
    data["env"] = {k: fill(v) for k, v in spec.env.items()}
    return McpServerSpec.from_dict(data)


def hub_spec(server: McpServer) -> McpServerSpec:
    """The spec an episode's hub starts for this registered server, secrets filled in."""
    return resolved_spec(McpServerSpec.from_dict(server.spec), list(server.secrets), server.fixtures)


def tools_sha256(tools: list[dict[str, Any]]) -> str:
    canonical = json.dumps(tools, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def take_snapshot(record: ServerRecord, *, backend: Any = None) -> Snapshot:
    """Start the server in a fresh sandbox (fixtures set up) and take its tools/list; check the
    names the record gives and run its state probe. McpRegistryError naming the server."""
    spec = resolved_spec(record.spec, record.secrets, record.fixtures)
    sandbox_spec = SandboxSpec(image=PLATFORM_MCP_PROFILE, labels={"scene": "toucan", "purpose": "mcp-snapshot"},
                               ttl=SNAPSHOT_LIFETIME_S + 300, network=record.spec.sandbox_network)
    try:
        with (backend or get_backend()).create(sandbox_spec) as sandbox:
            install_fixtures(sandbox, record.fixtures)
            hub = McpHub([spec])
            started = time.monotonic()
            hub.start(sandbox, lifetime=SNAPSHOT_LIFETIME_S)
            start_ms = int((time.monotonic() - started) * 1000)
            tools = storable(hub.server_tools(spec.name), labels=False)
            _check_names(record, {t["name"] for t in tools})
            _run_probe(record, sandbox, hub)
            hub.close()
    except (McpStartError, McpSessionError, FixtureError, SandboxError, ToolError) as exc:
        raise McpRegistryError([f"{record.name}: {exc}"]) from None
    return Snapshot(tools=tools, sha256=tools_sha256(tools), start_ms=start_ms)


def _check_names(record: ServerRecord, names: set[str]) -> None:
    spec = record.spec
    wanted = {"deny_tools": spec.deny_tools, "platform_tools": spec.platform_tools,
              "allow_tools": spec.allow_tools or []}
    if record.state_probe and "tool" in record.state_probe:
        wanted["state_probe.tool"] = [record.state_probe["tool"]]
    errors = [f"{record.name}: {field} names {', '.join(sorted(set(listed) - names))}, which the server does not "
              f"offer (its tools: {', '.join(sorted(names))})" for field, listed in wanted.items() if set(listed) - names]
    if errors:
        raise McpRegistryError(errors)


def _run_probe(record: ServerRecord, sandbox: Any, hub: McpHub) -> None:
    probe = record.state_probe
    if not probe:
        return
    if "command" in probe:
        result = sandbox.run(probe["command"], timeout=PROBE_TIMEOUT_S)
        if result.exit_code != 0:
            raise McpRegistryError([f"{record.name}: the state probe {probe['command']} failed "
                                    f"(exit {result.exit_code}): {(result.stderr or result.stdout).strip()[-1000:]}"])
        return
    response = hub.call_platform(record.name, probe["tool"], probe.get("arguments", {}), timeout=PROBE_TIMEOUT_S)
    if response.is_error:
        raise McpRegistryError([f"{record.name}: the state probe tool {probe['tool']} failed: {response.text[:1000]}"])


# --- services ----------------------------------------------------------------------------------


def mcp_servers_register(*, records: list[Any], actor: Any, dry_run: bool = False,
                         actor_repr: str | None = None, backend: Any = None) -> list[Registered]:
    """Check and snapshot every record, then create or update their rows with one audit row each
    (all or nothing: McpRegistryError lists every bad record, and nothing is written)."""
    parsed: list[ServerRecord] = []
    errors: list[str] = []
    for index, data in enumerate(records):
        label = f"record {index + 1}" + (f" ({data['name']!r})" if isinstance(data, dict) and "name" in data else "")
        try:
            parsed.append(parse_record(data))
        except McpRegistryError as exc:
            errors += [f"{label}: {e}" for e in exc.errors]
    names = [r.name for r in parsed]
    errors += [f"the name {n!r} is given twice" for n in sorted({n for n in names if names.count(n) > 1})]
    if not records:
        errors.append("no server records")
    if errors:
        raise McpRegistryError(errors)
    snapshots = []
    for record in parsed:
        try:
            snapshots.append(take_snapshot(record, backend=backend))
        except McpRegistryError as exc:
            errors += exc.errors
    if errors:
        raise McpRegistryError(errors)
    if dry_run:
        previous = dict(McpServer.objects.filter(name__in=names).values_list("name", "tools_sha256"))
        return [Registered(name=r.name, snapshot=s, created=r.name not in previous,
                           previous_sha256=previous.get(r.name, "")) for r, s in zip(parsed, snapshots)]
    try:
        with transaction.atomic():
            return [_store(record, snapshot, actor=actor, actor_repr=actor_repr)
                    for record, snapshot in zip(parsed, snapshots)]
    except IntegrityError:
        raise McpRegistryError(["another registration of the same name ran at the same time; run it again"]) from None


def mcp_server_register(*, data: Any, actor: Any, actor_repr: str | None = None, backend: Any = None) -> Registered:
    """Register (or re-register) one server record; see `mcp_servers_register`."""
    return mcp_servers_register(records=[data], actor=actor, actor_repr=actor_repr, backend=backend)[0]


def _store(record: ServerRecord, snapshot: Snapshot, *, actor: Any, actor_repr: str | None) -> Registered:
    values = {"spec": record.spec.to_dict(), "labels": record.labels, "secrets": record.secrets,
              "fixtures": record.fixtures, "state_probe": record.state_probe, "enabled": record.enabled,
              "tools": snapshot.tools, "tools_sha256": snapshot.sha256, "snapshot_at": timezone.now(),
              "snapshot_start_ms": snapshot.start_ms}
    server = McpServer.objects.select_for_update().filter(name=record.name).first()
    created = server is None
    previous = "" if created else server.tools_sha256
    changed = [] if created else sorted(k for k in ("spec", "labels", "secrets", "fixtures", "state_probe", "enabled")
                                        if getattr(server, k) != values[k])
    if created:
        server = McpServer.objects.create(name=record.name, **values)
    else:
        for key, value in values.items():
            setattr(server, key, value)
        server.save()
    audit_record("engines.mcp_server_register", actor=actor, actor_repr=actor_repr, target=server, data={
        "created": created, "package": record.spec.package, "tools": len(snapshot.tools),
        "tools_sha256": snapshot.sha256, "previous_tools_sha256": previous,
        "tools_changed": not created and previous != snapshot.sha256, "fields_changed": changed,
        "start_ms": snapshot.start_ms,
    })
    return Registered(name=record.name, snapshot=snapshot, created=created, previous_sha256=previous, server=server)


def mcp_server_resnapshot(*, server: McpServer, actor: Any, backend: Any = None) -> Registered:
    """Take the registered server's tools/list again (in a sandbox) and store it; audit the hashes."""
    snapshot = take_snapshot(ServerRecord.of(server), backend=backend)
    with transaction.atomic():
        server = McpServer.objects.select_for_update().get(pk=server.pk)
        previous = server.tools_sha256
        server.tools, server.tools_sha256 = snapshot.tools, snapshot.sha256
        server.snapshot_at, server.snapshot_start_ms = timezone.now(), snapshot.start_ms
        server.save(update_fields=["tools", "tools_sha256", "snapshot_at", "snapshot_start_ms", "updated_at"])
        audit_record("engines.mcp_server_resnapshot", actor=actor, target=server, data={
            "tools": len(snapshot.tools), "tools_sha256": snapshot.sha256, "previous_tools_sha256": previous,
            "tools_changed": previous != snapshot.sha256, "start_ms": snapshot.start_ms,
        })
    return Registered(name=server.name, snapshot=snapshot, created=False, previous_sha256=previous, server=server)


def mcp_server_set_enabled(*, server: McpServer, enabled: bool, actor: Any) -> McpServer:
    """Enable or disable a registered server (a repeat is a no-op without an audit row)."""
    with transaction.atomic():
        server = McpServer.objects.select_for_update().get(pk=server.pk)
        if server.enabled == enabled:
            return server
        server.enabled = enabled
        server.save(update_fields=["enabled", "updated_at"])
        audit_record("engines.mcp_server_set_enabled", actor=actor, target=server, data={"enabled": enabled})
    return server


# -- the servers an episode starts (the toucan scene's runtime asks through install_server_reader) --


def _read_servers(names: list[str]) -> list[Server]:
    rows = {row.name: row for row in McpServer.objects.filter(name__in=names)}
    missing = [n for n in names if n not in rows]
    if missing:
        raise SetupError(f"the task's MCP servers {', '.join(missing)} are not registered "
                         "(`manage.py mcp_register examples/toucan/servers.json`)")
    disabled = [n for n in names if not rows[n].enabled]
    if disabled:
        raise SetupError(f"the task's MCP servers {', '.join(disabled)} are disabled in the registry")
    servers = []
    for name in names:
        row = rows[name]
        try:
            spec = hub_spec(row)
        except McpRegistryError as exc:
            raise SetupError(str(exc)) from None
        servers.append(Server(spec=spec, tools=list(row.tools or []), fixtures=dict(row.fixtures or {}),
                              tools_sha256=row.tools_sha256))
    return servers


def read_servers(names: list[str]) -> list[Server]:
    """The named servers' rows, in that order, as an episode starts them (SetupError: unknown or
    disabled). Called by the loop from its event loop too (a runtime's `tools`), where Django refuses
    database access: there the read runs in a thread of its own, which closes its connection."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _read_servers(names)

    def read() -> list[Server]:
        try:
            return _read_servers(names)
        finally:
            connections.close_all()

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="toucan-registry") as pool:
        return pool.submit(read).result()


def install() -> None:
    """Give the toucan scene its reader of the registered servers (the scene imports no app)."""
    install_server_reader(read_servers)
