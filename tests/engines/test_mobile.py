"""The mobile_agent scene through the shared loop and the offline model: the bundled demo's scripts and
their rewards on the simulator (each check kind passing), a run that leaves the device untouched
(each check kind failing), device mode against an adb endpoint (no device reachable is an
infrastructure error, never the simulator), and the Redroid path through the OpenSandbox loopback
fake (lifecycle, endpoint resolution, adb connect, boot wait)."""
from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse

from apps.engines.scenes.mobile_agent.runtime import check_config
from apps.engines.scenes.mobile_agent.sim import initial_state, start_simulator
from apps.engines.offline_model import running_offline_model
from apps.engines.sandboxes import get_backend
from apps.engines.registry import SceneConfigError, validate_scene_config
from tests.engines.opensandbox_fake import FakeOpenSandbox
from tests.engines.test_agent import call, client, config_for, llm_env, run  # noqa: F401 - llm_env is a fixture
from tests.engines.test_gui import artifact_root  # noqa: F401 - a fixture
from trajplatform.artifacts import step_screenshot

DEMO = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "mobile_agent.jsonl"
ROWS = [json.loads(line) for line in DEMO.read_text(encoding="utf-8").splitlines() if line.strip()]
EVERY_KIND = [
    {"type": "shell", "command": "settings get global bluetooth_on", "expect": {"equals": "1"}},
    {"type": "content", "uri": "content://com.android.contacts/data/phones", "where": "display_name='Bob'",
     "expect_rows": [{"number": "555-0111"}]},
    {"type": "ui", "resource_id": "com.android.settings:id/bluetooth_switch", "attr": "checked",
     "expect": {"equals": True}},
    {"type": "answer", "expected": "555-0111", "match": "exact"},
]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("llm_env", "artifact_root", "no_adb")]


@pytest.fixture
def no_adb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/bin/false")  # adbutils never starts a real adb server here


def episode(prompt: str, scene_config: dict[str, Any], script: list[dict[str, Any]], **kw: Any) -> Any:
    with running_offline_model(scripts=[{"id": "s", "prompt": prompt, "reference_solution": script}]) as server:
        return run(config_for(prompt, scene_config, scene="mobile_agent", max_steps=20), client(server.url),
                   **{"sandbox_backend": None, **kw})


def test_every_demo_script_earns_its_reward_on_the_simulator():
    assert len(ROWS) >= 10
    assert [r["external_id"] for r in ROWS if r["external_id"].endswith("-wrong")] == ["mobile-calc-48-div-6-wrong"]
    scripts = [{"id": r["external_id"], "prompt": r["prompt"], "reference_solution": r["reference_solution"]}
               for r in ROWS]
    results = {}
    with running_offline_model(scripts=scripts) as server:
        for row in ROWS:
            validate_scene_config("mobile_agent", row["config"])
            config = config_for(row["prompt"], row["config"], scene="mobile_agent", max_steps=row["max_steps"])
            results[row["external_id"]] = run(config, client(server.url), sandbox_backend=None)
    kinds_passed = set()
    for external_id, result in results.items():
        expected = 0.0 if external_id.endswith("-wrong") else 1.0
        assert result.reward == expected, (external_id, result.outcome_reason, result.verifier_output.get("checks"))
        assert not any(s.get("error") for s in result.steps), external_id
        device = result.verifier_output["device"]
        assert device["mode"] == "simulated" and device["simulated"] is True and "not a real phone" in device["label"]
        for step in result.steps:
            if step["tool"] not in ("finish", "answer"):
                assert step["images"][0]["artifact"] and step["device_mode"] == "simulated"
                assert step["ui_elements"] and "device_state_after" in step
        kinds_passed |= {c["type"] for c in result.verifier_output["checks"] if c["passed"]}
    assert kinds_passed == {"shell", "content", "ui", "answer"}
    calc = results["mobile-calc-37x36"]  # a vision task: the model was shown the screenshots
    shown = [p for m in calc.messages if isinstance(m.get("content"), list) for p in m["content"]
             if p.get("type") == "image_url"]
    assert shown and all(p["image_url"]["url"].startswith("artifact:") for p in shown)
    tap = calc.steps[1]
    assert tap["action"]["type"] == "click" and tap["element"]["text"] == "3" and tap["action"]["box"]["width"] > 0
    # What the review console draws: the tap on the screen the agent tapped (the previous step's), the result beside it.
    shot = step_screenshot(tap, calc.steps[0]["images"][-1])
    assert shot["before"]["point"]["left"] == pytest.approx(100 * tap["action"]["x"] / 720) and shot["before"]["box"]["width"] > 0
    assert shot["before"]["url"].endswith(calc.steps[0]["images"][-1]["artifact"]) and "box" not in shot["after"]
    assert shot["after"]["url"].endswith(tap["images"][-1]["artifact"])
    swipe = results["mobile-brightness-max"].steps[1]["action"]
    assert (swipe["type"], swipe["x"], swipe["x2"], swipe["point"]) == ("swipe", 360, 700, {"x": 360, "y": 636})
    assert results["mobile-infeasible-nfc"].verifier_output["status"] == "infeasible"
    zhang = results["mobile-contact-zhang-san"].verifier_output
    assert zhang["final_state"]["contacts"][0]["display_name"] == "张三"
    wrong = results["mobile-calc-48-div-6-wrong"].verifier_output["checks"][0]
    assert wrong == {"type": "answer", "passed": False, "expected": "8", "match": "number", "answer": "42"}


def test_each_check_kind_fails_when_the_device_is_left_as_it_was():
    prompt = "Turn on Bluetooth and tell me Bob's number."
    scene = {"mode": "simulated", "start_app": "com.android.settings", "checks": EVERY_KIND,
             "initial_state": {"contacts": [{"display_name": "Alice", "number": "555-0110"}]}}
    result = episode(prompt, scene, [call("click", index=99), call("finish", status="complete", summary="done")])
    assert result.reward == 0.0
    assert result.steps[0]["error"].startswith("no element [99] on the screen")
    checks = result.verifier_output["checks"]
    assert [(c["type"], c["passed"]) for c in checks] == [(k["type"], False) for k in EVERY_KIND]
    assert checks[0]["output"] == "0" and checks[1]["rows"] == [] and checks[2]["value"] is False
    assert checks[3]["reason"] == "the agent gave no answer"


def test_an_infeasible_task_finished_as_complete_scores_zero_and_status_is_recorded():
    scene = {"mode": "simulated", "expect_status": "infeasible",
             "checks": [{"type": "shell", "command": "settings get global wifi_on", "expect": {"in": ["1", "2"]}}]}
    result = episode("Turn on NFC.", scene, [call("finish", status="complete", summary="NFC is on")])
    assert result.reward == 0.0 and result.verifier_output["status_ok"] is False
    assert "expects 'infeasible'" in result.verifier_output["note"]


def test_a_check_that_passes_on_any_output_is_refused_as_configuration():
    scene = {"mode": "simulated", "checks": [{"type": "shell", "command": "settings get global wifi_on"}]}
    result = episode("Do nothing.", scene, [call("finish", status="complete")])
    assert result.outcome == "error" and result.error_kind == "config"
    assert "passes on anything is no check" in result.outcome_reason


def test_the_config_names_its_mode_and_device_mode_takes_no_initial_state():
    with pytest.raises(SceneConfigError, match="mode"):
        validate_scene_config("mobile_agent", {"checks": EVERY_KIND})
    assert check_config({"mode": "device", "initial_state": {"contacts": []}, "device": {"serial": "x"}}) == [
        ("initial_state", "only the simulator takes an initial_state; a device is reset with `reset` shell commands")]
    assert check_config({"mode": "device"})[0][0] == "device.serial"
    assert check_config({"mode": "simulated", "initial_state": {"wifi": 1}})[0][0] == "initial_state"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_device_mode_with_no_device_reachable_is_an_infrastructure_error_not_the_simulator():
    scene = {"mode": "device", "device": {"adb_server": f"127.0.0.1:{_closed_port()}", "serial": "emulator-5554"},
             "checks": EVERY_KIND[:1]}
    result = episode("Turn on Bluetooth.", scene, [call("finish", status="complete")])
    assert result.outcome == "error" and result.error_kind == "infrastructure" and result.retryable
    assert "no Android device reachable in device mode" in result.outcome_reason
    assert result.steps == [] and result.llm_calls == 0  # nothing ran: no simulator stood in


def test_device_mode_against_an_adb_server_with_a_device_attached():
    # The simulator plays the worker's adb server with an emulator attached: the production code path.
    adb = start_simulator(initial_state({"contacts": [{"display_name": "Bob", "number": "555-0111"}]}))
    try:
        scene = {"mode": "device", "device": {"adb_server": f"127.0.0.1:{adb.port}", "serial": adb.serial,
                                              "settle_s": 0},
                 "reset": ["settings put global bluetooth_on 0"], "start_app": "Settings", "checks": EVERY_KIND[:3]}
        result = episode("Turn on Bluetooth.", scene, [
            call("input_text", index=1, text="张三"),  # a device needs an IME for non-ASCII text
            call("click", index=8), call("finish", status="complete", summary="on")])
    finally:
        adb.stop()
    assert result.reward == 1.0, result.verifier_output
    assert "needs an IME" in result.steps[0]["error"]
    device = result.verifier_output["device"]
    assert device == {"mode": "device", "simulated": False, "provider": "endpoint", "serial": "emulator-5554",
                      "adb_server": f"127.0.0.1:{adb.port}"}
    assert result.steps[1]["device_mode"] == "device" and "device_state_after" not in result.steps[1]
    assert "settings put global bluetooth_on 0" in adb.shell_commands[0]


class HostNetworkFake(FakeOpenSandbox):
    """The fake as OpenSandbox's Docker runtime in host network mode: adbd's port is a plain host:port."""

    adbd = ""

    async def endpoint(self, request: Request) -> Any:
        if request.path_params["port"] == 5555 and self.adbd:
            self.requests.append((request.method, request.url.path))
            return JSONResponse({"endpoint": self.adbd})
        return await super().endpoint(request)


@pytest.fixture
def host_fake(tmp_path: Path, settings: Any) -> Any:
    fake = HostNetworkFake(tmp_path / "osb")
    fake.start()
    settings.OPENSANDBOX_URL, settings.OPENSANDBOX_API_KEY = fake.url, fake.api_key
    yield fake
    fake.stop()


def test_redroid_through_opensandbox_resolves_adbd_connects_and_is_destroyed(host_fake):
    address = f"127.0.0.1:{_closed_port()}"
    host_fake.adbd = address
    adb = start_simulator(connectable={address})  # the worker's adb server, which reaches the Redroid's adbd
    backend = get_backend("opensandbox")
    try:
        scene = {"mode": "device", "device": {"provider": "opensandbox", "adb_server": f"127.0.0.1:{adb.port}",
                                              "settle_s": 0, "boot_timeout_s": 5},
                 "start_app": "Settings", "checks": EVERY_KIND[:1]}
        result = episode("Turn on Bluetooth.", scene, [call("click", index=8), call("finish", status="complete")],
                         sandbox_backend=backend)
    finally:
        adb.stop()
        backend.close()
    assert result.reward == 1.0, (result.outcome_reason, result.verifier_output)
    body = host_fake.create_bodies[-1]
    assert body["image"]["uri"] == "redroid/redroid:14.0.0-latest" and body["resourceLimits"]["cpu"] == "2"
    assert body["entrypoint"] == ["/init", "qemu=1", "androidboot.hardware=redroid"]  # Android's own init boots it
    sandbox_id = result.sandbox["id"]
    assert ("GET", f"/v1/sandboxes/{sandbox_id}/endpoints/5555") in host_fake.requests
    assert ("DELETE", f"/v1/sandboxes/{sandbox_id}") in host_fake.requests and result.sandbox["destroyed"]
    assert address not in adb.connected  # disconnected when the sandbox went
    device = result.verifier_output["device"]
    assert device["provider"] == "opensandbox" and device["serial"] == address and device["simulated"] is False
    assert any(c.startswith("getprop sys.boot_completed") for c in adb.shell_commands)


def test_redroid_behind_an_http_proxy_endpoint_is_refused_with_the_reason(opensandbox_backend, fake):
    scene = {"mode": "device", "device": {"provider": "opensandbox"}, "checks": EVERY_KIND[:1]}
    result = episode("Turn on Bluetooth.", scene, [call("finish", status="complete")],
                     sandbox_backend=opensandbox_backend)
    assert result.outcome == "error" and result.error_kind == "config"
    assert "an HTTP proxy path: adb needs a plain TCP host:port" in result.outcome_reason
    assert result.sandbox["destroyed"]


def test_the_simulator_stops_with_an_episode_that_ends_before_verify(monkeypatch: pytest.MonkeyPatch):
    import gc

    from apps.engines.scenes.mobile_agent import runtime as mobile_runtime

    started = []

    def start(*args: Any, **kwargs: Any) -> Any:
        started.append(start_simulator(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(mobile_runtime, "start_simulator", start)
    scene = {"mode": "simulated", "checks": EVERY_KIND[:1]}
    with running_offline_model(scripts=[{"id": "s", "prompt": "Loop.", "reference_solution": [
            call("navigate_home"), call("navigate_home"), call("navigate_home")]}]) as server:
        result = run(config_for("Loop.", scene, scene="mobile_agent", max_steps=2), client(server.url),
                     sandbox_backend=None)
    assert result.outcome == "failure" and "max_steps" in result.outcome_reason
    gc.collect()  # the episode's context is gone: its finalizer stops the device
    assert len(started) == 1 and not started[0].running
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", started[0].port), timeout=1).close()
