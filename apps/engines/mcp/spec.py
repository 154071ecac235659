"""What the hub needs to know about one MCP server: `McpServerSpec`, a plain JSON-round-trippable record.

    spec = McpServerSpec(name="time", argv=["python3", "-m", "mcp_server_time", "--local-timezone=UTC"],
                         package={"kind": "pypi", "name": "mcp-server-time", "version": "2026.10.19"})
    McpServerSpec.from_dict(spec.to_dict()) == spec      # McpSpecError on a bad or unknown field

Launch: `argv` runs inside the episode's sandbox (cwd `cwd`, environment `env` on top of the
sandbox's). `transport` is how that process speaks MCP: "stdio" (its stdin/stdout) or "http"
(it listens on `port` and serves streamable HTTP at `path`; "{host}" and "{port}" in `argv` are
replaced by `host` and `port`). A stdio server can also give `http_argv`, the same server
listening on a port, for backends that reach processes only over HTTP (OpenSandbox); without it
such a backend cannot run the server. `package` says where the program comes from
({"kind": "pypi"|"npm"|"module", "name", "version"}): the hub does not install anything, the
sandbox's image or profile provides it; the registry keeps it for audit and the lock.

Tools: the agent sees the server's tools named `<namespace>__<tool>` (namespace defaults to the
server's name; "" gives the bare names, as envscaler's one server does), minus `deny_tools`,
minus `platform_tools` (callable by the platform only, e.g. envscaler_state), and, when
`allow_tools` is a list, only those. `call_timeout_s` bounds one call (the loop's step timeout
may cut it shorter), `start_timeout_s` the start (spawn, initialize, tools/list).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

TRANSPORTS = ("stdio", "http")
# What the server needs from its sandbox's network: "none" (offline, the default) or "egress"
# (a production server that reaches the internet: its episodes get network="open", which only
# the OpenSandbox backend gives; the local backend refuses it with a clear error).
NETWORKS = ("none", "egress")
PACKAGE_KINDS = ("pypi", "npm", "module")
SEPARATOR = "__"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class McpSpecError(ValueError):
    """A server spec that cannot be used (the message names the field)."""


@dataclass
class McpServerSpec:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    transport: str = "stdio"
    http_argv: list[str] | None = None
    port: int | None = None
    host: str = "0.0.0.0"
    path: str = "/mcp"
    package: dict[str, str] = field(default_factory=dict)
    namespace: str | None = None
    allow_tools: list[str] | None = None
    deny_tools: list[str] = field(default_factory=list)
    platform_tools: list[str] = field(default_factory=list)
    call_timeout_s: float = 30.0
    start_timeout_s: float = 60.0
    network: str = "none"

    def __post_init__(self) -> None:
        self.validate()

    @property
    def prefix(self) -> str:
        """What the agent's tool names start with ("" for none)."""
        namespace = self.name if self.namespace is None else self.namespace
        return f"{namespace}{SEPARATOR}" if namespace else ""

    def agent_name(self, tool: str) -> str:
        return self.prefix + tool

    def offers(self, tool: str) -> bool:
        """Whether the agent may see and call `tool` of this server."""
        if tool in self.deny_tools or tool in self.platform_tools:
            return False
        return self.allow_tools is None or tool in self.allow_tools

    @property
    def sandbox_network(self) -> str:
        """The SandboxSpec network mode this server needs."""
        return "open" if self.network == "egress" else "none"

    def launch_argv(self, transport: str) -> list[str]:
        """The command for `transport` ("stdio" or "http"), placeholders filled in."""
        if transport == self.transport:
            argv = self.argv
        elif transport == "http" and self.http_argv:
            argv = self.http_argv
        else:
            raise McpSpecError(f"the MCP server {self.name!r} cannot be reached over {transport} "
                               f"(it speaks {self.transport}{' and http' if self.http_argv else ''})")
        if transport == "http":
            return [a.replace("{host}", self.host).replace("{port}", str(self.port)) for a in argv]
        return list(argv)

    def validate(self) -> None:
        def strings(value: Any, what: str, *, empty: bool = True) -> None:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or (not empty and not value):
                raise McpSpecError(f"{what} must be a {'' if empty else 'non-empty '}list of strings, got {value!r}")

        if not isinstance(self.name, str) or not NAME_RE.match(self.name) or SEPARATOR in self.name:
            raise McpSpecError(f"name must be 1-64 letters, digits, '-' or '_' without {SEPARATOR!r}, got {self.name!r}")
        strings(self.argv, "argv", empty=False)
        if self.http_argv is not None:
            strings(self.http_argv, "http_argv", empty=False)
        if not isinstance(self.env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in self.env.items()):
            raise McpSpecError(f"env must map strings to strings, got {self.env!r}")
        if self.cwd is not None and not isinstance(self.cwd, str):
            raise McpSpecError(f"cwd must be a string, got {self.cwd!r}")
        if self.transport not in TRANSPORTS:
            raise McpSpecError(f"transport must be one of {', '.join(TRANSPORTS)}, got {self.transport!r}")
        if self.port is not None and (isinstance(self.port, bool) or not isinstance(self.port, int)
                                      or not 0 < self.port < 65536):
            raise McpSpecError(f"port must be an integer in 1..65535, got {self.port!r}")
        if (self.transport == "http" or self.http_argv) and self.port is None:
            raise McpSpecError(f"the MCP server {self.name!r} serves HTTP and needs a port")
        if not isinstance(self.host, str) or not isinstance(self.path, str) or not self.path.startswith("/"):
            raise McpSpecError(f"host must be a string and path start with '/', got {self.host!r}, {self.path!r}")
        if not isinstance(self.package, dict) or not all(isinstance(v, str) for v in self.package.values()):
            raise McpSpecError(f"package must map strings to strings, got {self.package!r}")
        unknown = set(self.package) - {"kind", "name", "version"}
        if unknown or (self.package and self.package.get("kind") not in PACKAGE_KINDS):
            raise McpSpecError(f"package is {{kind: {'|'.join(PACKAGE_KINDS)}, name, version}}, got {self.package!r}")
        if self.namespace is not None and (not isinstance(self.namespace, str) or SEPARATOR in self.namespace
                                           or (self.namespace and not NAME_RE.match(self.namespace))):
            raise McpSpecError(f"namespace must be null, '' or a name without {SEPARATOR!r}, got {self.namespace!r}")
        if self.allow_tools is not None:
            strings(self.allow_tools, "allow_tools")
        strings(self.deny_tools, "deny_tools")
        strings(self.platform_tools, "platform_tools")
        if self.network not in NETWORKS:
            raise McpSpecError(f"network must be one of {', '.join(NETWORKS)}, got {self.network!r}")
        for name in ("call_timeout_s", "start_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise McpSpecError(f"{name} must be a positive number of seconds, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "McpServerSpec":
        if not isinstance(data, dict):
            raise McpSpecError(f"an MCP server spec must be an object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise McpSpecError(f"unknown fields in the MCP server spec {data.get('name')!r}: {', '.join(unknown)}")
        missing = [name for name in ("name", "argv") if name not in data]
        if missing:
            raise McpSpecError(f"the MCP server spec lacks {', '.join(missing)}")
        return cls(**data)
