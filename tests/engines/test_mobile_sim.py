"""The simulated Android device driven by the unmodified adbutils client (2.12.0), for every command it
claims: the host protocol (version, devices, transports, get-state/features, connect), shell v1 and v2
with the small shell's `;`, `&&`, `||`, quotes and `$?`, sync STAT/RECV/SEND/LIST, screencap,
uiautomator dump, input, wm/dumpsys, settings, content query, am/monkey/pm/svc, getprop — and the
apps' behaviour behind them."""
from __future__ import annotations

import io
from typing import Any, Iterator

import adbutils
import pytest
from PIL import Image

from apps.engines.scenes.mobile_agent.sim import initial_state, start_simulator
from apps.engines.scenes.mobile_agent.sim.apps import evaluate

assert adbutils.__version__ == "2.12.0"


@pytest.fixture(autouse=True)
def no_adb_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    # adbutils runs `adb start-server` when it cannot connect; never a real adb here.
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/bin/false")


@pytest.fixture
def sim() -> Iterator[Any]:
    sim = start_simulator(initial_state({"contacts": [{"display_name": "Alice", "number": "555-0110"}]}),
                          connectable={"10.0.0.9:5555"})
    yield sim
    sim.stop()


def device(sim: Any) -> adbutils.AdbDevice:
    return adbutils.AdbClient(host=sim.host, port=sim.port).device(sim.serial)


def test_host_protocol_version_devices_state_features_and_connect(sim):
    client = adbutils.AdbClient(host=sim.host, port=sim.port)
    assert client.server_version() == 41
    assert [(d.serial, d.state) for d in client.list()] == [("emulator-5554", "device")]
    assert client.list(extended=True)[0].tags["model"] == "trajplatform_sim"
    assert [d.serial for d in client.device_list()] == ["emulator-5554"]
    d = client.device(sim.serial)
    assert d.get_state() == "device" and d.get_serialno() == "sim-0001"
    assert "shell_v2" in d.get_features()
    assert client.connect("10.0.0.9:5555") == "connected to 10.0.0.9:5555"
    assert client.device("10.0.0.9:5555").get_state() == "device"
    assert "failed to connect" in client.connect("10.0.0.8:5555")
    assert client.disconnect("10.0.0.9:5555") == "disconnected 10.0.0.9:5555"
    with pytest.raises(adbutils.AdbError, match="not found"):
        client.device("nope").get_state()
    with pytest.raises(adbutils.AdbError, match="not found"):
        client.device("nope").shell("echo hi")


def test_shell_v1_and_v2_with_operators_quotes_and_exit_status(sim):
    d = device(sim)
    assert d.shell("echo 'a  b' \"c $? d\"; false; echo $?") == "a  b c 0 d\n1"
    assert d.shell("false && echo no || echo yes; true && echo also") == "yes\nalso"
    assert d.shell(["echo", "it's; not && a command"]) == "it's; not && a command"
    v1 = d.shell2("nosuch --flag")
    assert v1.returncode == 127 and "nosuch: not found" in v1.output
    v2 = d.shell2("nosuch", v2=True)
    assert (v2.returncode, v2.stdout, v2.stderr.strip()) == (127, "", "/system/bin/sh: nosuch: not found")
    assert d.shell2("echo ok", v2=True).stdout == "ok\n"
    piped = d.shell2("getprop | grep x")
    assert piped.returncode == 2 and "not supported by the simulator" in piped.output


def test_screen_commands_window_size_screenshot_and_uiautomator_dump_over_sync(sim):
    d = device(sim)
    assert d.window_size() == (720, 1280) and d.rotation() == 0
    image = d.screenshot()
    assert image.size == (720, 1280)
    png = d.shell(["screencap", "-p"], encoding=None)
    assert Image.open(io.BytesIO(png)).size == (720, 1280)
    xml = d.dump_hierarchy()  # rm -f; uiautomator dump ... && echo success; then sync RECV
    assert xml.startswith("<?xml") and 'text="Contacts"' in xml
    info = d.sync.stat("/data/local/tmp/uidump.xml")
    assert info.size == len(xml.encode())
    d.sync.push(b"hello", "/data/local/tmp/x.txt")
    assert d.sync.read_bytes("/data/local/tmp/x.txt") == b"hello"
    assert {f.path for f in d.sync.list("/data/local/tmp")} == {"uidump.xml", "x.txt"}
    assert d.shell("cat /data/local/tmp/x.txt; rm /data/local/tmp/x.txt; ls /data/local/tmp") == "hellouidump.xml"
    with pytest.raises(adbutils.AdbError, match="No such file"):
        d.sync.read_bytes("/data/local/tmp/missing")


def test_input_settings_content_and_apps(sim):
    d = device(sim)
    d.app_start("com.android.settings", ".Settings")  # am start -n
    assert d.app_current().package == "com.android.settings"  # dumpsys window windows
    d.click(626, 236)  # the Wi-Fi switch
    assert d.shell("settings get global wifi_on") == "0"
    d.switch_wifi(True)  # svc wifi enable
    assert d.shell("settings get global wifi_on") == "1"
    d.switch_airplane(True)  # settings put + am broadcast
    assert d.shell("settings get global airplane_mode_on; settings get global wifi_on") == "1\n0"
    d.swipe(360, 636, 700, 636, 0.3)  # the brightness slider to the right end
    assert d.brightness_value == 255
    d.brightness_value = 100  # settings put system
    assert d.shell("settings get system screen_brightness") == "100"
    d.app_start("com.android.contacts")  # monkey -p ... 1
    d.click(600, 1150)  # Create contact
    d.click(360, 244)
    d.send_keys("张三 Li")  # input text '张三 Li'
    d.click(360, 364)
    d.shell("input text 138%s0013")
    d.click(536, 506)  # Save
    rows = d.shell("content query --uri content://com.android.contacts/data/phones --where \"display_name='张三 Li'\"")
    assert rows == "Row: 0 _id=2, display_name=张三 Li, number=138 0013"
    d.keyevent(4)  # back to the list
    assert 'text="张三 Li"' in d.dump_hierarchy()
    assert d.shell("content query --uri content://com.android.contacts/data/phones --where \"number LIKE '555%'\" "
                   "--projection display_name") == "Row: 0 display_name=Alice"
    assert d.shell("content query --uri content://nope/x").startswith("Error while accessing provider")
    assert "com.android.calculator2" in d.list_packages()  # pm list packages
    assert d.shell("pm clear com.android.contacts") == "Success"
    assert d.shell("content query --uri content://com.android.contacts/data/phones") == "No result found."
    d.keyevent("KEYCODE_HOME")
    assert d.app_current().package == "com.android.launcher3"
    assert d.getprop("ro.trajplatform.simulated") == "1" and d.prop.model == "trajplatform_sim"
    assert "[sys.boot_completed]: [1]" in d.shell("getprop")
    assert d.shell("wm density") == "Physical density: 320"


def test_calculator_keys_and_arithmetic(sim):
    d = device(sim)
    d.app_start("com.android.calculator2")
    d.send_keys("37*36")
    d.keyevent(66)
    assert sim.device.state["calculator"]["result"] == "1332"
    assert evaluate("48÷6") == "8" and evaluate("1÷0") == "Can't divide by 0" and evaluate("2×(3+4)−.5") == "13.5"
    assert evaluate("1+") == "Error"


def test_the_device_channel_types_shell_and_input_special_characters_verbatim(sim):
    from apps.engines.scenes.mobile_agent.device import DeviceChannel, Endpoint

    channel = DeviceChannel(Endpoint(sim.host, sim.port, sim.serial), mode="device")
    channel.launch("org.trajplatform.notes")
    channel.tap(600, 1150)  # New note
    channel.tap(360, 466)  # the note's body (a multi-line field)
    text = "O'Brien & \"co\"; $(rm -rf /) `x` 100% done\nline two"
    assert channel.input_text(text) == "input text"  # spaces as %s, shell-quoted, the newline as ENTER
    assert sim.device.ui["form"]["body"] == text
    assert any(c.startswith("input text 'O'\"'\"'Brien%s&%s") for c in sim.shell_commands)
    with pytest.raises(ValueError, match="needs an IME"):
        channel.input_text("张三")  # a device's `input text` types ASCII only
    assert channel.input_text("张三", ime="adbkeyboard") == "adbkeyboard"
    assert sim.shell_commands[-1].startswith("am broadcast -a ADB_INPUT_TEXT --es msg '张三'")
