"""Measuring an image the platform did not make, before anything decodes it.

An imported trajectory's screenshots, a sandboxed browser's or a real device's screenshots and
an MCP server's images come from outside. A PNG of a few hundred bytes can declare 30000x30000
pixels: whoever decodes it (a thumbnail, a model API client, a trainer's data loader) then asks
for gigabytes. `measure(data, mime)` reads only the header (Pillow's `Image.open` is lazy: the
pixels are never decompressed here) and refuses, with a reason a person can act on:

- more than IMAGE_MAX_BYTES bytes (checked before Pillow sees the data),
- a header Pillow cannot read, or a format other than the declared mime type,
- more than IMAGE_MAX_PIXELS pixels (width x height, every frame of an animation counted).

The artifact store calls it for every image it keeps, so each caller is covered once.
"""
from __future__ import annotations

import io
import threading
import warnings
from dataclasses import dataclass

from django.conf import settings

FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP", "image/gif": "GIF"}
# warnings.catch_warnings swaps process-wide state: two threads measuring at once must not restore
# each other's filters.
_warnings_lock = threading.Lock()


class ImageError(ValueError):
    """An image that is too large, unreadable, or not what it says it is."""


@dataclass(frozen=True)
class ImageSize:
    mime: str
    width: int
    height: int


def measure(data: bytes, mime: str) -> ImageSize:
    """The image's size from its header, within IMAGE_MAX_BYTES and IMAGE_MAX_PIXELS (ImageError otherwise)."""
    from PIL import Image, UnidentifiedImageError  # deferred: heavy (Pillow), only when an image is measured

    if mime not in FORMATS:
        raise ImageError(f"the image type {mime} is not one of {', '.join(FORMATS)}")
    max_bytes, max_pixels = settings.IMAGE_MAX_BYTES, settings.IMAGE_MAX_PIXELS
    if not data:
        raise ImageError("the image is empty")
    if len(data) > max_bytes:
        raise ImageError(f"the image has {len(data)} bytes; at most {max_bytes} are kept (IMAGE_MAX_BYTES)")
    try:
        # Pillow's open() warns past Image.MAX_IMAGE_PIXELS (our own bound below decides) and
        # raises past twice that.
        with _warnings_lock, warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=[FORMATS[mime]]) as image:
                width, height = image.size
                frames = int(getattr(image, "n_frames", 1) or 1)
    except Image.DecompressionBombError:
        limit = 2 * (Image.MAX_IMAGE_PIXELS or 0)
        raise ImageError(f"the image declares more than {limit} pixels (Pillow's decompression-bomb limit); at "
                         f"most {max_pixels} are kept (IMAGE_MAX_PIXELS)") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError):
        # SyntaxError / EOFError: what some of Pillow's format plugins raise for a broken header
        raise ImageError(f"the image's data is not a readable {mime}") from None
    if width <= 0 or height <= 0:
        raise ImageError(f"the image declares {width}x{height} pixels")
    if width * height * frames > max_pixels:
        frames_text = f" in {frames} frames, {width * height * frames} in all" if frames > 1 else ""
        raise ImageError(f"the image declares {width}x{height} pixels{frames_text}; at most {max_pixels} "
                         "are kept (IMAGE_MAX_PIXELS)")
    return ImageSize(mime, width, height)
