"""What a model package declares about its image input (`models push --image`), and the checks that keep it servable.

An image model takes `[N, 3, H, W]` (NCHW) or `[N, H, W, 3]` (NHWC) floats. The manifest's `image` says how a
picture becomes one row of that input: decoded to RGB, its shorter side resized to `resize` (when given), the
centre `crop` (height, width: the input's own H and W) cut out, scaled to [0, 1], then `(x - mean) / std` per
channel. servestack/inference/images.py does it at serve time; these checks run wherever a manifest is read, so a
hand-edited manifest is refused at load, not at its first request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgspec

Layout = Literal["NCHW", "NHWC"]
IMAGE_DTYPES = ("float32", "float16")
Positive = Annotated[int, msgspec.Meta(ge=1, le=16384)]


class ImageSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """How a picture becomes a row of `input` (see the module's docstring)."""

    input: str
    layout: Layout
    crop: tuple[Positive, Positive]
    resize: Positive | None = None
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)


def spatial_axes(layout: Layout) -> tuple[int, int, int]:
    """The (channel, height, width) axes of an input of this layout, batch first."""
    return (1, 2, 3) if layout == "NCHW" else (3, 1, 2)


def check_image(image: ImageSpec, inputs: Sequence[Any]) -> None:
    """`image` names an input of the model, of a float dtype and the layout's rank, with 3 channels and the crop's
    size where the graph fixes them; std is never 0, and a resize leaves room for the crop."""
    by_name = {spec.name: spec for spec in inputs}
    spec = by_name.get(image.input)
    if spec is None:
        raise ValueError(f"image.input: {image.input!r} is not one of the inputs {sorted(by_name)}")
    if spec.dtype not in IMAGE_DTYPES:
        raise ValueError(f"image: input {spec.name!r} is {spec.dtype}; an image input is float32 or float16")
    if len(spec.shape) != 4:
        shape = list(spec.shape)
        raise ValueError(f"image: input {spec.name!r} is {shape}; an image input is [N, C, H, W] or [N, H, W, C]")
    channel, height, width = spatial_axes(image.layout)
    if spec.shape[channel] not in (3, None):
        raise ValueError(
            f"image: input {spec.name!r} is {list(spec.shape)}: {image.layout} puts the channels at axis {channel}, "
            f"which has {spec.shape[channel]}, not 3 (RGB)"
        )
    for axis, size, what in ((height, image.crop[0], "height"), (width, image.crop[1], "width")):
        if spec.shape[axis] is not None and spec.shape[axis] != size:
            raise ValueError(
                f"image.crop: {image.crop[0]}x{image.crop[1]}, but input {spec.name!r} ({image.layout}) has {what} "
                f"{spec.shape[axis]}"
            )
    if any(not value > 0 for value in image.std):  # `not >` refuses NaN as well
        raise ValueError(f"image.std: {list(image.std)}; every channel's std must be > 0")
    if image.resize is not None and image.resize < max(image.crop):
        raise ValueError(
            f"image.resize: {image.resize} makes the shorter side smaller than the {image.crop[0]}x{image.crop[1]} crop"
        )
