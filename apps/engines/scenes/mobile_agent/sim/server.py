"""The simulated device's ADB endpoint: the adb *host protocol* (what a client says to an adb server),
as adbutils 2.12 speaks it, on 127.0.0.1:<ephemeral>, one thread per connection.

A request is 4 hex digits of length and the payload; the answer OKAY or FAIL + a length-prefixed
message. Served: host:version (41), host:devices, host:devices-l, host:track-devices (one list),
host:tport:serial:<s> / host:tport:any (OKAY + 8-byte transport id), host:transport:<s>,
host:transport-any, host:transport-id:<n>, host-serial:<s>:get-state|get-serialno|get-devpath|features,
host:connect:<addr> / host:disconnect:<addr> (only addresses the simulator was told it may
"connect", standing in for the worker's adb server in front of a remote adbd), host:kill; then on
a transport: shell:<cmd> (raw output until close), shell,v2:<cmd> (packets: 1 stdout, 2 stderr,
3 exit), sync: STAT, RECV (DATA chunks + DONE), SEND, LIST, QUIT. Anything else: FAIL.
"""
from __future__ import annotations

import socket
import socketserver
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from . import shell
from .apps import SimDevice, initial_state

SIM_LABEL = "simulated Android device (trajplatform android_sim, not a real phone)"
SERVER_VERSION = 41
FEATURES = "shell_v2,cmd,stat_v2,ls_v2,fixed_push_mkdir,apex,abb,abb_exec"
SYNC_CHUNK = 64 * 1024


class _Closed(Exception):
    pass


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise _Closed()
        buf += chunk
    return bytes(buf)


def _block(text: str | bytes) -> bytes:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return f"{len(data):04x}".encode() + data


class _Handler(socketserver.BaseRequestHandler):
    server: "_Server"

    def handle(self) -> None:
        sock = self.request
        sock.settimeout(self.server.idle_timeout)
        try:
            while True:
                length = int(_read_exact(sock, 4), 16)
                request = _read_exact(sock, length).decode("utf-8", errors="replace")
                self.server.sim.requests += 1
                if not self.dispatch(sock, request):
                    return
        except (_Closed, ConnectionError, socket.timeout, ValueError, OSError):
            return

    def fail(self, sock: socket.socket, message: str) -> bool:
        sock.sendall(b"FAIL" + _block(message))
        return False

    def dispatch(self, sock: socket.socket, request: str) -> bool:
        """Answer one request; True when the connection stays open for another."""
        sim = self.server.sim
        device = sim.device
        if request == "host:version":
            sock.sendall(b"OKAY" + _block(f"{SERVER_VERSION:04x}"))
            return False
        if request in ("host:devices", "host:devices-l", "host:track-devices"):
            lines = []
            for serial in sim.serials():
                extra = (f" product:{device.state['props']['ro.product.name']} model:"
                         f"{device.state['props']['ro.product.model']} device:sim transport_id:1"
                         if request == "host:devices-l" else "")
                lines.append(f"{serial}\tdevice{extra}\n")
            sock.sendall(b"OKAY" + _block("".join(lines)))
            return False
        if request == "host:kill":
            sock.sendall(b"OKAY")
            return False
        if request.startswith("host:connect:"):
            address = request[len("host:connect:"):]
            if address in sim.connectable:
                sim.connected.add(address)
                sock.sendall(b"OKAY" + _block(f"connected to {address}"))
            else:
                sock.sendall(b"OKAY" + _block(f"failed to connect to '{address}': Connection refused"))
            return False
        if request.startswith("host:disconnect:"):
            address = request[len("host:disconnect:"):]
            sim.connected.discard(address)
            sock.sendall(b"OKAY" + _block(f"disconnected {address}"))
            return False
        if request.startswith("host-serial:"):
            serial, _, what = request[len("host-serial:"):].rpartition(":")
            if serial not in sim.serials():
                return self.fail(sock, f"device '{serial}' not found")
            answers = {"get-state": "device", "get-serialno": device.state["props"]["ro.serialno"],
                       "get-devpath": "sim", "features": FEATURES}
            if what not in answers:
                return self.fail(sock, f"unsupported by the simulator: {what}")
            sock.sendall(b"OKAY" + _block(answers[what]))
            return False
        if request.startswith("host:tport:"):
            target = request[len("host:tport:"):]
            serial = target[len("serial:"):] if target.startswith("serial:") else None
            if target != "any" and serial not in sim.serials():
                return self.fail(sock, f"device '{serial}' not found")
            sock.sendall(b"OKAY" + struct.pack("<Q", 1))
            return True
        if request.startswith("host:transport"):
            target = request[len("host:transport"):]
            ok = target in ("-any", "-usb", "-local", "-id:1") or (
                target.startswith(":") and target[1:] in sim.serials())
            if not ok:
                return self.fail(sock, f"device '{target.lstrip(':')}' not found")
            sock.sendall(b"OKAY")
            return True
        if request.startswith("shell,v2:") or request.startswith("shell,v2,raw:"):
            out, err, code, _ = shell.run(device, request.split(":", 1)[1])
            sim.shell_commands.append(request.split(":", 1)[1])
            sock.sendall(b"OKAY")
            for packet_id, data in ((1, out), (2, err)):
                for i in range(0, len(data), SYNC_CHUNK):
                    part = data[i:i + SYNC_CHUNK]
                    sock.sendall(bytes([packet_id]) + struct.pack("<I", len(part)) + part)
            sock.sendall(bytes([3]) + struct.pack("<I", 1) + bytes([code & 0xFF]))
            return False
        if request.startswith("shell:"):
            command = request[len("shell:"):]
            sim.shell_commands.append(command)
            _, _, _, both = shell.run(device, command)
            sock.sendall(b"OKAY" + both)
            return False
        if request == "sync:":
            sock.sendall(b"OKAY")
            self.sync(sock, device)
            return False
        return self.fail(sock, f"unknown host service '{request}'")

    def sync(self, sock: socket.socket, device: SimDevice) -> None:
        while True:
            ident = _read_exact(sock, 4)
            length = struct.unpack("<I", _read_exact(sock, 4))[0]
            if ident == b"QUIT":
                return
            path = _read_exact(sock, length).decode("utf-8", errors="replace")
            if ident == b"STAT":
                with device.lock:
                    data = device.files.get(path)
                if data is not None:
                    sock.sendall(b"STAT" + struct.pack("<III", 0o100644, len(data), int(time.time())))
                elif path.rstrip("/") in ("/data/local/tmp", "/sdcard", "/data/local", "/data", ""):
                    sock.sendall(b"STAT" + struct.pack("<III", 0o040771, 4096, int(time.time())))
                else:
                    sock.sendall(b"STAT" + struct.pack("<III", 0, 0, 0))
            elif ident == b"RECV":
                with device.lock:
                    data = device.files.get(path)
                if data is None:
                    message = b"No such file or directory"
                    sock.sendall(b"FAIL" + struct.pack("<I", len(message)) + message)
                    return
                for i in range(0, len(data), SYNC_CHUNK):
                    part = data[i:i + SYNC_CHUNK]
                    sock.sendall(b"DATA" + struct.pack("<I", len(part)) + part)
                sock.sendall(b"DONE" + struct.pack("<I", 0))
            elif ident == b"SEND":
                target = path.rsplit(",", 1)[0]
                received = bytearray()
                while True:
                    kind = _read_exact(sock, 4)
                    size = struct.unpack("<I", _read_exact(sock, 4))[0]
                    if kind == b"DONE":
                        break
                    if kind != b"DATA":
                        raise _Closed()
                    received += _read_exact(sock, size)
                with device.lock:
                    device.files[target] = bytes(received)
                sock.sendall(b"OKAY" + struct.pack("<I", 0))
            elif ident == b"LIST":
                folder = path.rstrip("/") + "/"
                with device.lock:
                    entries = [(p[len(folder):], d) for p, d in sorted(device.files.items())
                               if p.startswith(folder) and "/" not in p[len(folder):]]
                for name, data in entries:
                    raw = name.encode("utf-8")
                    sock.sendall(b"DENT" + struct.pack("<IIII", 0o100644, len(data), int(time.time()), len(raw)) + raw)
                sock.sendall(b"DONE" + struct.pack("<IIII", 0, 0, 0, 0))
            else:
                message = f"unsupported sync request {ident!r}".encode()
                sock.sendall(b"FAIL" + struct.pack("<I", len(message)) + message)
                return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    sim: "Simulator"
    idle_timeout: float = 30.0


@dataclass
class Simulator:
    """A running simulated device; `stop()` ends it (idempotent)."""

    device: SimDevice
    host: str = "127.0.0.1"
    port: int = 0
    connectable: set[str] = field(default_factory=set)  # addresses host:connect accepts
    connected: set[str] = field(default_factory=set)
    shell_commands: list[str] = field(default_factory=list)  # what was run, in order (tests, bench)
    requests: int = 0
    _server: Any = None
    _thread: Any = None
    _timer: Any = None

    @property
    def serial(self) -> str:
        return self.device.serial

    def serials(self) -> list[str]:
        return [self.device.serial, *sorted(self.connected)]

    def stop(self) -> None:
        server, self._server = self._server, None
        if self._timer is not None:
            self._timer.cancel()
        if server is not None:
            server.shutdown()
            server.server_close()

    @property
    def running(self) -> bool:
        return self._server is not None


def start_simulator(state: dict[str, Any] | None = None, *, serial: str = "emulator-5554",
                    lifetime_s: float | None = None, connectable: set[str] | None = None) -> Simulator:
    """Start a simulated device on 127.0.0.1:<ephemeral>; it stops itself after `lifetime_s`."""
    device = SimDevice(state if state is not None else initial_state(), serial=serial)
    sim = Simulator(device=device, connectable=set(connectable or ()))
    server = _Server(("127.0.0.1", 0), _Handler)
    server.sim = sim
    sim._server = server
    sim.port = server.server_address[1]
    sim._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                   name=f"android-sim-{sim.port}", daemon=True)
    sim._thread.start()
    if lifetime_s:
        # A backstop: an episode that ends without its runtime stopping the device still frees it.
        sim._timer = threading.Timer(lifetime_s, sim.stop)
        sim._timer.daemon = True
        sim._timer.start()
    return sim
