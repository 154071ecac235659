"""Warm pools per image (apps/engines/sandboxes/pool.py's shapes, apps/engines/sandbox_records.py's rows, SANDBOX_POOL_IMAGES) on the OpenSandbox
backend, against the loopback fake: the reconciler fills each pool, `acquire` hands out a warm
sandbox of the spec's image (code_exec's spec for a task naming that image), other shapes get a
fresh one, and a pool whose size was lowered or that was dropped is trimmed."""
from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from apps.engines import jobs
from apps.engines.scenes.code_exec.runtime import CodeExecRuntime
from apps.engines.models import SandboxRecord
from apps.engines.sandboxes import SandboxSpec, acquire
from apps.engines.sandbox_records import fill_pool
from apps.engines.sandboxes.pool import pool_key, pooled_spec, pools

pytestmark = pytest.mark.usefixtures("sandbox_settings")

TOOLS_IMAGE = "trajplatform-python"


def pooled(image: str | None) -> set[str]:
    key = pool_key("opensandbox", pooled_spec(image))
    return set(SandboxRecord.objects.filter(state=SandboxRecord.State.POOLED, pool_key=key)
               .values_list("external_id", flat=True))


def test_each_image_gets_its_own_warm_pool_filled_by_the_reconciler_and_claimed_by_its_spec(
        opensandbox_backend: Any, fake: Any, settings: Any) -> None:
    settings.SANDBOX_BACKEND = "opensandbox"
    settings.SANDBOX_POOL_SIZE = 0
    settings.SANDBOX_POOL_IMAGES = f"{TOOLS_IMAGE}=2, python:3.11=1"

    report = jobs.reconcile_sandboxes()

    assert report["pool"] == {"created": 3, "trimmed": 0, "size": 3}
    assert len(pooled(TOOLS_IMAGE)) == 2 and len(pooled("python:3.11")) == 1 and not pooled(None)
    made = [body["image"]["uri"] for body in fake.create_bodies[-3:]]
    assert sorted(made) == ["python:3.11", TOOLS_IMAGE, TOOLS_IMAGE]

    spec = CodeExecRuntime().sandbox_spec({"scene": "code_exec", "scene_config": {"image": TOOLS_IMAGE}})
    warm = pooled(TOOLS_IMAGE)
    handed: list[Any] = []
    try:
        handed.append(acquire(spec, backend=opensandbox_backend))
        assert handed[-1].id in warm  # the episode's sandbox was already running
        assert handed[-1].run("echo warm", timeout=30).stdout == "warm\n"
        handed.append(acquire(SandboxSpec(image="node:20"), backend=opensandbox_backend))
        handed.append(acquire(SandboxSpec(), backend=opensandbox_backend))  # the default shape has no pool
        assert not {h.id for h in handed[1:]} & (warm | pooled("python:3.11"))
        assert len(pooled(TOOLS_IMAGE)) == 1

        assert fill_pool(opensandbox_backend)["created"] == 1  # refilled
        settings.SANDBOX_POOL_IMAGES = f"{TOOLS_IMAGE}=1"  # lowered, and python:3.11 dropped
        assert fill_pool(opensandbox_backend) == {"created": 0, "trimmed": 2, "size": 1}
        assert len(pooled(TOOLS_IMAGE)) == 1 and not pooled("python:3.11")
    finally:
        for handle in handed:
            handle.destroy()
        settings.SANDBOX_POOL_IMAGES = ""
        fill_pool(opensandbox_backend)
    assert not SandboxRecord.objects.filter(state=SandboxRecord.State.POOLED).exists()


@pytest.mark.parametrize("value", ["python:3.11", "python:3.11=x", "=2", "a=1,a=2"])
def test_a_malformed_pool_setting_names_the_entry(settings: Any, value: str) -> None:
    settings.SANDBOX_POOL_IMAGES = value
    with pytest.raises(ImproperlyConfigured, match="SANDBOX_POOL_IMAGES"):
        pools()
