"""Images from outside are measured before anything decodes them (trajplatform/images.py, issue 36
item 1): decompression bombs, oversized and mislabelled images are refused by the artifact store
with a reason, and nothing is written."""
from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path
from typing import Any, Iterator

import pytest

from trajplatform import artifacts
from trajplatform.images import ImageError, measure


def png_bytes(width: int, height: int, color: str = "red") -> bytes:
    """A real PNG of that size (Pillow-encoded)."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, format="PNG")
    return out.getvalue()


def bomb_png(width: int, height: int) -> bytes:
    """A PNG of a few dozen bytes whose header declares width x height pixels (a decompression
    bomb's shape: decoding it would allocate width*height*3 bytes)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")


@pytest.fixture
def artifact_store(settings: Any, tmp_path: Path) -> Iterator[Path]:
    """The artifact store in a per-test directory."""
    from django.core.files.storage import storages

    root = tmp_path / "artifacts"
    settings.STORAGES = {**settings.STORAGES, "artifacts": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(root)}}}
    storages._storages.pop("artifacts", None)
    yield root
    storages._storages.pop("artifacts", None)


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_measure_reads_the_size_from_the_header() -> None:
    assert measure(png_bytes(7, 5), "image/png").width == 7
    assert (measure(bomb_png(4000, 3000), "image/png").height) == 3000  # never decoded, so cheap


@pytest.mark.parametrize("size, reason", [
    ((30000, 30000), "decompression-bomb limit"),  # Pillow's own DecompressionBombError
    ((12000, 12000), "12000x12000 pixels"),  # Pillow only warns; our bound refuses
    ((6000, 5000), "6000x5000 pixels"),  # under Pillow's limits, over IMAGE_MAX_PIXELS
])
def test_measure_refuses_more_pixels_than_the_setting(size: tuple[int, int], reason: str) -> None:
    with pytest.raises(ImageError, match=reason) as caught:
        measure(bomb_png(*size), "image/png")
    assert "IMAGE_MAX_PIXELS" in str(caught.value)


def test_measure_follows_the_settings_and_refuses_bytes_before_reading_them(settings: Any) -> None:
    settings.IMAGE_MAX_PIXELS = 100
    with pytest.raises(ImageError, match="IMAGE_MAX_PIXELS"):
        measure(png_bytes(11, 10), "image/png")
    settings.IMAGE_MAX_BYTES = 50
    with pytest.raises(ImageError, match="IMAGE_MAX_BYTES"):
        measure(b"\0" * 51, "image/png")


@pytest.mark.parametrize("data, mime", [
    (b"\x89PNG fake screenshot bytes", "image/png"),
    (b"\x89PNG\r\n\x1a\n" + b"\0" * 24, "image/png"),  # a signature and nothing readable
    (png_bytes(4, 4), "image/jpeg"),  # a PNG labelled JPEG
    (b"GIF89a", "image/gif"),
])
def test_measure_refuses_bytes_that_are_not_the_declared_image(data: bytes, mime: str) -> None:
    with pytest.raises(ImageError, match=f"not a readable {mime}"):
        measure(data, mime)


@pytest.mark.django_db
@pytest.mark.parametrize("size", [(30000, 30000), (12000, 12000)])
def test_the_artifact_store_refuses_a_bomb_and_writes_nothing(artifact_store: Path, size: tuple[int, int]) -> None:
    with pytest.raises(artifacts.ArtifactError, match="IMAGE_MAX_PIXELS"):
        artifacts.store(bomb_png(*size), "image/png", width=10, height=10)
    assert artifacts.Artifact.objects.count() == 0 and _files(artifact_store) == []


@pytest.mark.django_db
def test_the_artifact_store_keeps_the_measured_size_not_the_callers(artifact_store: Path) -> None:
    ref = artifacts.store(png_bytes(9, 4), "image/png", width=500, height=360)
    assert (ref["width"], ref["height"]) == (9, 4)
    assert len(_files(artifact_store)) == 1


def test_an_mcp_image_that_is_not_kept_is_named_with_the_reason() -> None:
    import base64

    from mcp.types import ImageContent

    from apps.engines.mcp.hub import keep_image, render

    block = ImageContent(type="image", data=base64.b64encode(bomb_png(30000, 30000)).decode(), mimeType="image/png")
    record = keep_image(block)
    assert "artifact" not in record and "IMAGE_MAX_PIXELS" in record["not_kept"]
    assert "not kept" in render([record])[0]


class _Response:
    is_error = False

    def __init__(self, payload: dict[str, Any]):
        self.text = __import__("json").dumps(payload)


class _BrowserHub:
    """Answers platform_observe as the gui MCP server does: a screenshot file in the sandbox."""
    replaying = False

    def call_platform(self, server: str, tool: str, args: dict[str, Any]) -> _Response:
        return _Response({"url": "http://127.0.0.1/", "title": "t", "screenshot": "/tmp/shot.png",
                          "width": 500, "height": 360})


class _Sandbox:
    def __init__(self, data: bytes):
        self.data, self.asked = data, []

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        self.asked.append(max_bytes)
        return self.data[:max_bytes] if max_bytes is not None else self.data


@pytest.mark.django_db
def test_a_browser_screenshot_past_the_limits_is_named_on_the_step_and_not_stored(
        artifact_store: Path, settings: Any) -> None:
    from apps.engines.scenes.gui.runtime import GuiRuntime, _Live

    runtime, live = GuiRuntime(), _Live(hub=_BrowserHub())  # type: ignore[arg-type]
    sandbox = _Sandbox(bomb_png(30000, 30000))
    observed = runtime._observe(sandbox, live)  # type: ignore[arg-type]
    assert "screenshot" not in observed and "IMAGE_MAX_PIXELS" in observed["observe_error"]
    settings.IMAGE_MAX_BYTES = 1000
    sandbox = _Sandbox(b"\x89PNG" + b"\0" * 5000)
    observed = runtime._observe(sandbox, live)  # type: ignore[arg-type]
    assert sandbox.asked == [1001] and "IMAGE_MAX_BYTES" in observed["observe_error"]
    ok = runtime._observe(_Sandbox(png_bytes(50, 36)), live)  # type: ignore[arg-type]
    assert (ok["screenshot"]["width"], ok["screenshot"]["height"]) == (50, 36)  # measured, not the server's word
    assert artifacts.Artifact.objects.count() == 1 and len(_files(artifact_store)) == 1


def test_every_frame_of_an_animation_counts(settings: Any) -> None:
    from PIL import Image

    frames = [Image.new("RGB", (100, 100), color) for color in ("red", "blue", "green")]
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:])
    settings.IMAGE_MAX_PIXELS = 25000
    with pytest.raises(ImageError, match="100x100 pixels in 3 frames, 30000 in all"):
        measure(out.getvalue(), "image/gif")
