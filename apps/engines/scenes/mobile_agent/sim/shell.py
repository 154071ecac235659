"""The simulated device's shell: `;`, `&&`, `||`, single and double quotes, backslashes and `$?`,
and the Android commands adbutils and the mobile scene send.

    run(device, "rm -f /data/local/tmp/uidump.xml; uiautomator dump /data/local/tmp/uidump.xml && echo success")
    -> (stdout bytes, stderr bytes, exit code)

Commands: screencap -p [file], uiautomator dump [file], input tap|text|swipe|keyevent|draganddrop,
wm size, wm density, dumpsys display|window|power, settings get|put|delete|list, content query,
am start -n|-a, am force-stop, am broadcast, monkey -p <pkg> ... 1, pm clear|list packages|path,
svc wifi|bluetooth enable|disable, getprop [name], rm [-f] [-r], echo, cat, ls, true, false,
sleep. Anything else is `sh: <name>: not found` with exit 127; a command with a pipe, a
redirection or `&` is refused with exit 2 (never run half), and the line goes on after it.
"""
from __future__ import annotations

import re
import time
from typing import Callable

from .apps import APPS, COLUMNS, HEIGHT, LAUNCHER, WIDTH, SimDevice

Result = tuple[bytes, bytes, int]
KEYCODES = {"HOME": 3, "BACK": 4, "ENTER": 66, "DEL": 67, "MOVE_HOME": 122, "MOVE_END": 123, "TAB": 61,
            "ESCAPE": 111, "SPACE": 62, "DPAD_UP": 19, "DPAD_DOWN": 20, "DPAD_LEFT": 21, "DPAD_RIGHT": 22,
            "APP_SWITCH": 187, "POWER": 26, "VOLUME_UP": 24, "VOLUME_DOWN": 25, "VOLUME_MUTE": 164}
DENSITY = 320
CONTENT_URIS = {
    "content://com.android.contacts/data/phones": "contacts",
    "content://com.android.contacts/contacts": "contacts",
    "content://com.android.deskclock/alarms": "alarms",
    "content://org.trajplatform.notes/notes": "notes",
}


class ShellSyntaxError(ValueError):
    pass


UNSUPPORTED = "\0unsupported:"


def tokenize(line: str, status: int) -> list[list[str] | str]:
    """Words and operators (`;`, `&&`, `||`) of a command line, quotes removed, `$?` expanded."""
    out: list[list[str] | str] = []
    words: list[str] = []
    word: list[str] = []
    has_word = False
    i, n = 0, len(line)

    def end_word() -> None:
        nonlocal word, has_word
        if has_word:
            words.append("".join(word))
        word, has_word = [], False

    while i < n:
        ch = line[i]
        if ch in " \t\n":
            end_word()
            i += 1
        elif ch == "'":
            j = line.find("'", i + 1)
            if j < 0:
                raise ShellSyntaxError("unterminated quoted string")
            word.append(line[i + 1:j])
            has_word = True
            i = j + 1
        elif ch == '"':
            i += 1
            while True:
                if i >= n:
                    raise ShellSyntaxError("unterminated quoted string")
                c = line[i]
                if c == '"':
                    i += 1
                    break
                if c == "\\" and i + 1 < n and line[i + 1] in '"\\$`':
                    word.append(line[i + 1])
                    i += 2
                elif c == "$" and line[i:i + 2] == "$?":
                    word.append(str(status))
                    i += 2
                else:
                    word.append(c)
                    i += 1
            has_word = True
        elif ch == "\\" and i + 1 < n:
            word.append(line[i + 1])
            has_word = True
            i += 2
        elif ch == "$" and line[i:i + 2] == "$?":
            word.append(str(status))
            has_word = True
            i += 2
        elif line.startswith("&&", i) or line.startswith("||", i) or ch == ";":
            end_word()
            op = line[i:i + 2] if ch in "&|" else ";"
            out.append(words)
            out.append(op)
            words = []
            i += len(op)
        elif ch in "|<>&`":
            # Refused for this command only (exit 2), so a caller's `; echo $?` still runs.
            end_word()
            words.append(UNSUPPORTED + ch)
            i += 1
        else:
            word.append(ch)
            has_word = True
            i += 1
    end_word()
    out.append(words)
    return out


def run(device: SimDevice, line: str) -> tuple[bytes, bytes, int, bytes]:
    """Run a command line: (stdout, stderr, exit status, both interleaved as a v1 shell sends
    them); `$?` is expanded when each command is reached, as sh does."""
    stdout, stderr, both = bytearray(), bytearray(), bytearray()
    status = 0
    try:
        # Tokenized once per command so `$?` sees the previous command's status.
        pending = line
        skip = False
        while True:
            parts = tokenize(pending, status)
            argv = parts[0]
            assert isinstance(argv, list)
            refused = next((w for w in argv if w.startswith(UNSUPPORTED)), None)
            if not skip and refused:
                out, err, status = _err(f"/system/bin/sh: {refused[len(UNSUPPORTED):]!r} (pipes, redirections, "
                                        "background jobs) is not supported by the simulator", 2)
                stderr += err
                both += err
            elif not skip and argv:
                out, err, status = command(device, argv)
                stdout += out
                stderr += err
                both += out + err
            if len(parts) == 1:
                break
            op = parts[1]
            skip = (op == "&&" and status != 0) or (op == "||" and status == 0)
            pending = _rest_after_first_operator(pending)
    except ShellSyntaxError as exc:
        message = f"/system/bin/sh: syntax error: {exc}\n".encode()
        return bytes(stdout), bytes(stderr) + message, 2, bytes(both) + message
    return bytes(stdout), bytes(stderr), status, bytes(both)


def _rest_after_first_operator(line: str) -> str:
    """The text after the first unquoted `;`, `&&` or `||`."""
    i, n = 0, len(line)
    while i < n:
        ch = line[i]
        if ch == "'":
            i = line.index("'", i + 1) + 1
        elif ch == '"':
            i += 1
            while line[i] != '"':
                i += 2 if line[i] == "\\" else 1
            i += 1
        elif ch == "\\":
            i += 2
        elif ch == ";":
            return line[i + 1:]
        elif line.startswith("&&", i) or line.startswith("||", i):
            return line[i + 2:]
        else:
            i += 1
    return ""


def _ok(text: str = "") -> Result:
    return text.encode("utf-8"), b"", 0


def _err(text: str, code: int = 1) -> Result:
    return b"", (text.rstrip("\n") + "\n").encode("utf-8"), code


def command(device: SimDevice, argv: list[str]) -> Result:
    name = argv[0]
    handler = COMMANDS.get(name)
    if handler is None:
        return _err(f"/system/bin/sh: {name}: not found", 127)
    with device.lock:
        return handler(device, argv[1:])


# -- commands ------------------------------------------------------------------------------

def _screencap(device: SimDevice, args: list[str]) -> Result:
    png = device.screenshot_png()
    rest = [a for a in args if a != "-p"]
    if rest and rest[0] == "-d":
        rest = rest[2:]
    if rest:
        device.files[rest[0]] = png
        return _ok()
    return png, b"", 0


def _uiautomator(device: SimDevice, args: list[str]) -> Result:
    if not args or args[0] != "dump":
        return _err("Usage: uiautomator dump [--compressed] [file]", 1)
    rest = [a for a in args[1:] if not a.startswith("--")]
    path = rest[0] if rest else "/sdcard/window_dump.xml"
    device.files[path] = device.hierarchy_xml().encode("utf-8")
    return _ok(f"UI hierchary dumped to: {path}\n")


def _int(value: str) -> int:
    return int(float(value))


def _input(device: SimDevice, args: list[str]) -> Result:
    if args[:1] and args[0] in ("-d", "touchscreen", "keyboard"):
        args = args[2:] if args[0] == "-d" else args[1:]
    if not args:
        return _err("Usage: input [<source>] <command> [<arg>...]")
    sub, rest = args[0], args[1:]
    try:
        if sub == "tap" and len(rest) == 2:
            device.tap(_int(rest[0]), _int(rest[1]))
        elif sub in ("swipe", "draganddrop") and len(rest) in (4, 5):
            x1, y1, x2, y2 = (_int(v) for v in rest[:4])
            device.swipe(x1, y1, x2, y2, _int(rest[4]) if len(rest) == 5 else 300)
        elif sub == "text" and rest:
            device.text(" ".join(rest).replace("%s", " "))
        elif sub == "keyevent" and rest:
            longpress = "--longpress" in rest
            for key in (k for k in rest if not k.startswith("--")):
                code = _keycode(key)
                if code is None:
                    return _err(f"Error: Unknown keycode: {key}")
                if not longpress:
                    device.key(code)
        else:
            return _err(f"Error: Unknown command or wrong arguments: input {' '.join(args)}")
    except ValueError:
        return _err(f"Error: Invalid arguments for command: {sub}")
    return _ok()


def _keycode(key: str) -> int | None:
    if key.isdigit():
        return int(key)
    name = key.upper().removeprefix("KEYCODE_")
    return KEYCODES.get(name)


def _wm(device: SimDevice, args: list[str]) -> Result:
    if args[:1] == ["size"]:
        return _ok(f"Physical size: {WIDTH}x{HEIGHT}\n")
    if args[:1] == ["density"]:
        return _ok(f"Physical density: {DENSITY}\n")
    return _err(f"wm: unknown command {' '.join(args)}")


def _dumpsys(device: SimDevice, args: list[str]) -> Result:
    what = args[0] if args else ""
    if what == "display":
        return _ok(f"DISPLAY MANAGER (dumpsys display)\n  mDefaultViewport=DisplayViewport{{valid=true, "
                   f"orientation=0, deviceWidth={WIDTH}, deviceHeight={HEIGHT}}}\n  orientation=0\n")
    if what == "window":
        activity = device.current_activity()
        return _ok(f"  mCurrentFocus=Window{{1f2e3d u0 {activity}}}\n  mFocusedApp=ActivityRecord{{4a5b6c u0 {activity} t7}}\n")
    if what == "power":
        return _ok("  mWakefulness=Awake\n  Display Power: state=ON\n")
    if what == "battery":
        return _ok("Current Battery Service state:\n  AC powered: true\n  level: 100\n  scale: 100\n  status: 2\n")
    return _err(f"Can't find service: {what}")


def _settings(device: SimDevice, args: list[str]) -> Result:
    if len(args) >= 2 and args[0] in ("get", "put", "delete", "list"):
        verb, namespace = args[0], args[1]
        if namespace not in ("global", "system", "secure"):
            return _err(f"Invalid namespace '{namespace}'", 255)
        if verb == "get" and len(args) == 3:
            value = device.setting(namespace, args[2])
            return _ok(f"{'null' if value is None else value}\n")
        if verb == "put" and len(args) >= 4:
            device.put_setting(namespace, args[2], args[3])
            return _ok()
        if verb == "delete" and len(args) == 3:
            existed = device.state["settings"][namespace].pop(args[2], None) is not None
            return _ok(f"Deleted {int(existed)} rows\n")
        if verb == "list" and len(args) == 2:
            return _ok("".join(f"{k}={v}\n" for k, v in sorted(device.state["settings"][namespace].items())))
    return _err("usage: settings [--user <USER_ID>] get|put|delete|list NAMESPACE [KEY [VALUE]]", 255)


def _content(device: SimDevice, args: list[str]) -> Result:
    if not args or args[0] != "query":
        return _err("usage: content query --uri <URI> [--projection <PROJECTION>] [--where <WHERE>] [--sort <ORDER>]")
    opts: dict[str, str] = {}
    it = iter(args[1:])
    for flag in it:
        if flag in ("--uri", "--projection", "--where", "--sort", "--user"):
            opts[flag[2:]] = next(it, "")
        else:
            return _err(f"Unsupported argument: {flag}")
    uri = opts.get("uri", "")
    rows: list[dict[str, object]]
    if uri in CONTENT_URIS:
        table = CONTENT_URIS[uri]
        rows = [{c: r.get(c, "") for c in COLUMNS[table]} for r in sorted(device.state[table], key=lambda r: r["_id"])]
    elif uri.startswith("content://settings/") and uri.split("/")[-1] in ("global", "system", "secure"):
        rows = [{"name": k, "value": v} for k, v in sorted(device.state["settings"][uri.split("/")[-1]].items())]
    else:
        return _err(f"Error while accessing provider:{uri.removeprefix('content://').split('/')[0]}\n"
                    f"java.lang.IllegalArgumentException: Unknown URI {uri}")
    if opts.get("where"):
        try:
            test = _where(opts["where"])
        except ValueError as exc:
            return _err(f"Error while accessing provider: android.database.sqlite.SQLiteException: {exc}")
        rows = [r for r in rows if test(r)]
    if opts.get("sort"):
        column, _, order = opts["sort"].partition(" ")
        rows.sort(key=lambda r: _sort_key(r.get(column, "")), reverse=order.strip().upper() == "DESC")
    if opts.get("projection"):
        columns = opts["projection"].split(":")
        rows = [{c: r.get(c, "NULL") for c in columns} for r in rows]
    if not rows:
        return _ok("No result found.\n")
    return _ok("".join(f"Row: {n} " + ", ".join(f"{k}={v}" for k, v in r.items()) + "\n" for n, r in enumerate(rows)))


def _sort_key(value: object) -> tuple[int, object]:
    text = str(value)
    return (0, float(text)) if re.fullmatch(r"-?\d+(\.\d+)?", text) else (1, text)


_COND = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=|==|!=|<>|>=|<=|>|<|LIKE)\s*('(?:[^']|'')*'|-?\d+(?:\.\d+)?)\s*",
                   re.IGNORECASE)


def _where(clause: str) -> Callable[[dict[str, object]], bool]:
    """SQL-ish `col=value [AND|OR col=value ...]` (quoted strings, numbers, LIKE with %)."""
    parts = re.split(r"\s+(AND|OR)\s+", clause.strip(), flags=re.IGNORECASE)
    conds = []
    for part in parts[::2]:
        m = _COND.fullmatch(part)
        if not m:
            raise ValueError(f"near {part!r}: syntax error (the simulator takes col=value joined by AND/OR)")
        column, op, raw = m.group(1), m.group(2).upper(), m.group(3)
        value = raw[1:-1].replace("''", "'") if raw.startswith("'") else raw
        conds.append((column, op, value))
    joins = [j.upper() for j in parts[1::2]]

    def one(row: dict[str, object], column: str, op: str, value: str) -> bool:
        have = str(row.get(column, ""))
        if op == "LIKE":
            return re.fullmatch(re.escape(value).replace("%", ".*").replace("_", "."), have, re.IGNORECASE) is not None
        a, b = _sort_key(have), _sort_key(value)
        if a[0] != b[0]:
            a, b = (1, have), (1, value)
        return {"=": a == b, "==": a == b, "!=": a != b, "<>": a != b, ">": a > b, "<": a < b,
                ">=": a >= b, "<=": a <= b}[op]

    def test(row: dict[str, object]) -> bool:
        result = one(row, *conds[0])
        for join, cond in zip(joins, conds[1:]):
            result = (result and one(row, *cond)) if join == "AND" else (result or one(row, *cond))
        return result

    return test


def _am(device: SimDevice, args: list[str]) -> Result:
    if not args:
        return _err("usage: am [start|force-stop|broadcast] ...")
    verb, rest = args[0], args[1:]
    if verb == "start":
        component = ""
        action = ""
        it = iter(rest)
        for flag in it:
            if flag == "-n":
                component = next(it, "")
            elif flag == "-a":
                action = next(it, "")
            elif flag in ("-d", "-c", "-t", "--es", "--ei", "--ez"):
                next(it, "")
                if flag in ("--es", "--ei", "--ez"):
                    next(it, "")
        package = component.split("/")[0]
        if action == "android.settings.SETTINGS" or action == "android.settings.WIFI_SETTINGS":
            package = "com.android.settings"
        if not device.launch(package):
            return _ok(f"Starting: Intent {{ cmp={component} }}\nError type 3\n"
                       f"Error: Activity class {{{component}}} does not exist.\n")
        return _ok(f"Starting: Intent {{ cmp={device.current_activity()} }}\n")
    if verb == "force-stop" and rest:
        if device.ui["app"] == rest[0]:
            device.go_home()
        return _ok()
    if verb == "broadcast":
        return _ok("Broadcasting: Intent { }\nBroadcast completed: result=0\n")
    return _err(f"Error: unknown command '{verb}'")


def _monkey(device: SimDevice, args: list[str]) -> Result:
    if "-p" not in args:
        return _err("** No activities found to run, monkey aborted.")
    package = args[args.index("-p") + 1] if args.index("-p") + 1 < len(args) else ""
    if not device.launch(package):
        return _err("** No activities found to run, monkey aborted.", 252)
    return _ok("  bash arg: -p\n  bash arg: " + package + "\nEvents injected: 1\n")


def _pm(device: SimDevice, args: list[str]) -> Result:
    if args[:1] == ["clear"] and len(args) >= 2:
        return _ok("Success\n") if device.clear_app(args[-1]) else _err("Failed")
    if args[:2] == ["list", "packages"]:
        return _ok("".join(f"package:{p}\n" for p in [LAUNCHER, *APPS]))
    if args[:1] == ["path"] and len(args) == 2:
        if args[1] in APPS or args[1] == LAUNCHER:
            return _ok(f"package:/system/app/{args[1]}/base.apk\n")
        return _err("", 1)
    return _err(f"pm: unsupported in the simulator: {' '.join(args)}")


def _svc(device: SimDevice, args: list[str]) -> Result:
    names = {"wifi": "wifi_on", "bluetooth": "bluetooth_on"}
    if len(args) == 2 and args[0] in names and args[1] in ("enable", "disable"):
        device.put_setting("global", names[args[0]], "1" if args[1] == "enable" else "0")
        return _ok()
    return _err(f"svc: unsupported in the simulator: {' '.join(args)}")


def _getprop(device: SimDevice, args: list[str]) -> Result:
    props = device.state["props"]
    if args:
        return _ok(props.get(args[0], "") + "\n")
    return _ok("".join(f"[{k}]: [{v}]\n" for k, v in sorted(props.items())))


def _rm(device: SimDevice, args: list[str]) -> Result:
    force = any(a.startswith("-") and "f" in a for a in args)
    for path in (a for a in args if not a.startswith("-")):
        if device.files.pop(path, None) is None and not force:
            return _err(f"rm: {path}: No such file or directory")
    return _ok()


def _cat(device: SimDevice, args: list[str]) -> Result:
    out = bytearray()
    for path in args:
        if path not in device.files:
            return bytes(out), f"cat: {path}: No such file or directory\n".encode(), 1
        out += device.files[path]
    return bytes(out), b"", 0


def _ls(device: SimDevice, args: list[str]) -> Result:
    folder = (args[-1] if args and not args[-1].startswith("-") else "/data/local/tmp").rstrip("/") + "/"
    return _ok("".join(p[len(folder):] + "\n" for p in sorted(device.files) if p.startswith(folder)))


def _sleep(device: SimDevice, args: list[str]) -> Result:
    try:
        time.sleep(min(float(args[0]) if args else 0.0, 2.0))
    except ValueError:
        return _err(f"sleep: invalid number '{args[0]}'")
    return _ok()


COMMANDS: dict[str, Callable[[SimDevice, list[str]], Result]] = {
    "screencap": _screencap, "uiautomator": _uiautomator, "input": _input, "wm": _wm, "dumpsys": _dumpsys,
    "settings": _settings, "content": _content, "am": _am, "monkey": _monkey, "pm": _pm, "svc": _svc,
    "getprop": _getprop, "rm": _rm, "cat": _cat, "ls": _ls, "sleep": _sleep,
    "echo": lambda d, a: _ok(" ".join(a) + "\n"),
    "true": lambda d, a: _ok(), "false": lambda d, a: (b"", b"", 1),
}
