"""`models push --image`: how the package's pictures become its image input, declared at push and recorded in
the manifest (servestack/inference/image_spec.py), so that the model serves JPEG, PNG and WebP with no hook.

    --image resize=256,crop=224,layout=NCHW,mean=0.485:0.456:0.406,std=0.229:0.224:0.225

Every key is optional (`--image ''`, or `--image` alone, takes the graph's layout and size and only scales the
pixels to [0, 1]): `layout` is read from the input's shape where its channels (3) sit at one end only; `crop`
(N, or HxW) defaults to the input's fixed height and width. A package that declares an image requires Pillow,
which push adds to its requirements, so that every deployment serving it installs it.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from servestack.inference.errors import InvalidInput
from servestack.inference.image_spec import ImageSpec, check_image
from servestack.inference.manifest import TensorSpec

PILLOW = "Pillow>=9.1"  # Image.Resampling, which the serving code names, came in 9.1
_KEYS = ("resize", "crop", "layout", "mean", "std")
_FORM = "comma-separated KEY=VALUE of resize=N, crop=N or HxW, layout=NCHW or NHWC, mean=R:G:B, std=R:G:B"


@dataclass(frozen=True)
class ImageOptions:
    resize: int | None = None
    crop: tuple[int, int] | None = None
    layout: str | None = None
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None


def image_options(text: str | None) -> ImageOptions | None:
    """`--image`'s text -> its options (None: no `--image`); an InvalidInput naming the part that is wrong."""
    if text is None:
        return None
    found: dict[str, Any] = {}
    for part in (piece.strip() for piece in text.split(",")):
        if not part:
            continue
        key, equals, value = (item.strip() for item in part.partition("="))
        key = key.lower()
        if not equals or key not in _KEYS or key in found:
            what = "is given twice" if key in found else "is not KEY=VALUE of a known key"
            raise InvalidInput(f"--image: {part!r} {what}", field="--image", value=part, allowed=_FORM)
        found[key] = _value(key, value, part)
    return ImageOptions(**found)


def _value(key: str, value: str, part: str) -> Any:
    try:
        if key == "resize":
            return _positive(value)
        if key == "crop":
            height, _, width = value.lower().partition("x")
            return (_positive(height), _positive(width or height))
        if key == "layout":
            if value.upper() not in ("NCHW", "NHWC"):
                raise ValueError(value)
            return value.upper()
        channels = tuple(float(number) for number in value.split(":"))
        if len(channels) != 3:
            raise ValueError(value)
        return channels
    except ValueError:
        raise InvalidInput(
            f"--image: {part!r} is not a valid {key}", field="--image", value=part, allowed=_FORM
        ) from None


def _positive(text: str) -> int:
    number = int(text)
    if not 1 <= number <= 16384:
        raise ValueError(text)
    return number


def image_spec(options: ImageOptions, inputs: Sequence[TensorSpec]) -> ImageSpec:
    """The manifest's `image` for a model of these inputs: the options, completed from the graph."""
    if len(inputs) != 1:
        raise InvalidInput(
            f"--image: the model has {len(inputs)} inputs {[spec.name for spec in inputs]}; --image declares the "
            "input of a single-input model (give a multi-input model a --process hook)",
            field="--image",
            allowed="a model of one image input",
        )
    spec = inputs[0]
    shape = list(spec.shape)
    if len(shape) != 4:
        raise InvalidInput(
            f"--image: input {spec.name!r} is {shape}; an image input is [N, 3, H, W] or [N, H, W, 3]",
            field="--image",
            value=shape,
        )
    layout = options.layout or _layout_of(spec)
    height_axis, width_axis = (2, 3) if layout == "NCHW" else (1, 2)
    crop = options.crop
    if crop is None:
        height, width = shape[height_axis], shape[width_axis]
        if height is None or width is None:
            raise InvalidInput(
                f"--image: input {spec.name!r} is {shape}, of free height or width: give the size to crop to, "
                "e.g. --image crop=224",
                field="--image",
                value=shape,
                allowed=_FORM,
            )
        crop = (height, width)
    try:
        image = msgspec.convert(
            {
                "input": spec.name,
                "layout": layout,
                "crop": crop,
                "resize": options.resize,
                "mean": options.mean or (0.0, 0.0, 0.0),
                "std": options.std or (1.0, 1.0, 1.0),
            },
            ImageSpec,
        )
        check_image(image, inputs)
    except (ValueError, msgspec.ValidationError) as error:
        raise InvalidInput(f"--image: {error}", field="--image", allowed=_FORM) from None
    return image


def _layout_of(spec: TensorSpec) -> str:
    first, last = spec.shape[1], spec.shape[3]
    if first == 3 and last != 3:
        return "NCHW"
    if last == 3 and first != 3:
        return "NHWC"
    raise InvalidInput(
        f"--image: input {spec.name!r} is {list(spec.shape)}: its channels could be at axis 1 or 3; say which with "
        "--image layout=NCHW or layout=NHWC",
        field="--image",
        value=list(spec.shape),
        allowed=_FORM,
    )


def with_pillow(requirements: Sequence[str]) -> list[str]:
    """The package's requirements with Pillow, unless one of them already names it (at the user's version)."""
    from packaging.requirements import Requirement

    if any(Requirement(text).name.lower() == "pillow" for text in requirements):
        return list(requirements)
    return [*requirements, PILLOW]


def sample_request(image: ImageSpec) -> dict[str, Any]:
    """A request the package answers, in the form its users send: one mid-grey PNG of the crop's size, as b64 JSON."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (image.crop[1], image.crop[0]), (128, 128, 128)).save(buffer, format="PNG")
    return {"instances": [{"b64": base64.b64encode(buffer.getvalue()).decode()}]}
