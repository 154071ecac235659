"""The simulated Android device (a stand-in, like the offline model; docs/mobile_agent.md says what it
does not cover).

    sim = start_simulator(initial_state)      # an ADB host-protocol server on 127.0.0.1:<ephemeral>
    adbutils.AdbClient(host=sim.host, port=sim.port).device(sim.serial).shell("settings get global wifi_on")
    sim.device.snapshot()                      # the apps' state (JSON), for the step record
    sim.stop()

apps.py holds the device state and the declarative apps (screens as widget lists, rendered to
uiautomator XML and a Pillow PNG); shell.py the small shell and the Android commands the
simulator answers; server.py the ADB host protocol as adbutils speaks it.
"""
from .apps import SimDevice, initial_state
from .server import SIM_LABEL, Simulator, start_simulator

__all__ = ["SIM_LABEL", "SimDevice", "Simulator", "initial_state", "start_simulator"]
