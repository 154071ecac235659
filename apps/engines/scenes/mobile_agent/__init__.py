"""The mobile_agent scene: an agent operates Android apps through adbutils (docs/mobile_agent.md).

    device.py   the device channel (adbutils): connect, observe (UI tree + screenshot), act, checks
    runtime.py  MobileRuntime: AndroidWorld-aligned tools, the verifier, per-episode device start
    sim/        the simulated Android device: an ADB host-protocol server on 127.0.0.1 rendering
                declarative apps (Settings, Contacts, Clock, Calculator, Notes) to PNG and
                uiautomator XML; a labelled stand-in for offline demos and tests
"""
