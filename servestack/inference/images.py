"""Pictures -> an image model's input rows, for a package that declares its image input (`models push --image`)
and has no preprocess hook (a hook, where there is one, reads the bytes itself).

A request carries its pictures in one of three forms, each a batch in the order given:
- a raw body typed `image/jpeg`, `image/png` or `image/webp`: one picture;
- JSON `{"instances": [{"b64": "<base64>"}, ...]}` (TensorFlow Serving's form of binary values);
- `multipart/form-data`: every part that is a file or typed `image/*` is a picture; other fields are ignored.

Each is decoded by Pillow (JPEG, PNG or WebP, whatever the type claims, to RGB), its shorter side resized to
`resize` (bilinear) when the manifest asks, its centre cut to the input's height and width, scaled to [0, 1] and
normalised by the manifest's mean and std, in the input's layout and dtype (servestack/inference/image_spec.py).
A picture that is none of these, or is smaller than the crop, is a 400 naming the item and what is accepted.
Pillow is imported at the first picture: it ships with packages that declare an image (`push` adds it to their
requirements), not with servestack's runtime.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from servestack.inference.errors import InvalidInput, PayloadTooLarge, UnsupportedMediaType
from servestack.inference.image_spec import ImageSpec
from servestack.inference.media_types import IMAGE_TYPES, MULTIPART

ACCEPTED = (
    'an image/jpeg, image/png or image/webp body (one picture), JSON {"instances": [{"b64": "<base64>"}, ...]}, '
    "or multipart/form-data with image parts"
)
_FORMATS = {"JPEG", "PNG", "WEBP"}
# A picture's pixels, checked from its header before it is decoded: a small file that claims a huge picture (a
# decompression bomb) is refused without the memory. 40 megapixels is past any camera's photo this serves.
MAX_PIXELS = 40_000_000

Picture = tuple[str, bytes]  # (where the request holds it, for errors; its bytes)


def pictures_of_body(body: bytes, content_type: str) -> list[Picture]:
    """The pictures of a raw body (an image type or a multipart form); a 415 naming the forms taken otherwise."""
    media_type = content_type.partition(";")[0].strip()
    if media_type in IMAGE_TYPES:
        return [("body", body)]
    if media_type == MULTIPART:
        return _form_pictures(body, content_type)
    raise UnsupportedMediaType(
        f"Content-Type: {media_type!r} is not supported by this image model",
        field="Content-Type",
        value=media_type,
        allowed=f"{ACCEPTED}; or a tensor as application/json, text/csv or application/x-npy",
    )


def is_b64_instances(payload: Any) -> bool:
    """Whether a JSON payload is the `{"instances": [{"b64": ...}, ...]}` form (its first instance is an object)."""
    if type(payload) is not dict or set(payload) != {"instances"}:
        return False
    instances = payload["instances"]
    return type(instances) is list and bool(instances) and type(instances[0]) is dict


def pictures_of_json(payload: dict[str, Any]) -> list[Picture]:
    """The pictures of `{"instances": [{"b64": ...}, ...]}`; a 400 naming the instance that is not one."""
    found: list[Picture] = []
    for index, instance in enumerate(payload["instances"]):
        field = f"instances[{index}]"
        text = instance.get("b64") if type(instance) is dict and set(instance) == {"b64"} else None
        if type(text) is not str:
            raise InvalidInput(
                f'{field}: expected {{"b64": "<base64 of a picture>"}}',
                field=field,
                value=type(instance).__name__ if type(instance) is not dict else sorted(instance)[:5],
                allowed=ACCEPTED,
            )
        try:
            found.append((f"{field}.b64", base64.b64decode(text, validate=True)))
        except (binascii.Error, ValueError):
            raise InvalidInput(
                f"{field}.b64: not base64", field=f"{field}.b64", value=text[:40], allowed="standard base64 (RFC 4648)"
            ) from None
    return found


def _form_pictures(body: bytes, content_type: str) -> list[Picture]:
    # The stdlib reads a form as a MIME message: the Content-Type header (with its boundary) then the body.
    # Imported here, at the first form: email.policy costs every process that imports this module ~4 ms of its
    # start-up (a batch job, which never reads a form, among them).
    import email.parser
    import email.policy

    head = f"Content-Type: {content_type}\r\n\r\n".encode()
    form = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not form.is_multipart():
        raise InvalidInput("body: not a multipart form (no parts under its boundary)", field="body", allowed=ACCEPTED)
    found: list[Picture] = []
    for index, part in enumerate(form.iter_parts()):
        if part.get_filename() is None and part.get_content_maintype() != "image":
            continue  # a text field of the form (a caption): not a picture
        name = part.get_param("name", header="content-disposition") or str(index)
        payload = part.get_payload(decode=True)
        found.append((f"form part {index} ({name})", payload if isinstance(payload, bytes) else b""))
    if not found:
        raise InvalidInput(
            "body: the form holds no image parts (a part with a filename or an image/* type)",
            field="body",
            allowed=ACCEPTED,
        )
    return found


def image_rows(pictures: Sequence[Picture], image: ImageSpec, dtype: np.dtype[Any], max_rows: int) -> np.ndarray:
    """The input rows of `pictures`, one per picture, in the manifest's layout and the input's dtype."""
    if len(pictures) > max_rows:
        raise PayloadTooLarge(
            f"body: {len(pictures)} pictures, more than the {max_rows} rows a request may carry",
            field="body",
            value=len(pictures),
            allowed=f"at most {max_rows} pictures",
        )
    height, width = image.crop
    batch = np.empty((len(pictures), height, width, 3), dtype=np.uint8)
    for row, (where, data) in enumerate(pictures):
        batch[row] = _pixels(where, data, image)
    # One pass over the batch: x / 255 then (x - mean) / std, as x * a - b per channel.
    std = np.asarray(image.std, dtype=np.float32)
    scale = np.float32(1.0 / 255.0) / std
    shift = np.asarray(image.mean, dtype=np.float32) / std
    rows = batch * scale - shift  # float32: the uint8 batch is promoted by the float32 factors
    if image.layout == "NCHW":
        rows = rows.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(rows, dtype=dtype)


def _pixels(where: str, data: bytes, image: ImageSpec) -> np.ndarray:
    """One picture's `[crop height, crop width, 3]` uint8 RGB pixels, resized and cropped."""
    from PIL import Image, UnidentifiedImageError

    try:
        opened = Image.open(io.BytesIO(data), formats=sorted(_FORMATS))
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as error:
        raise _unreadable(where, data, error) from None
    with opened:
        width, height = opened.size
        if width * height > MAX_PIXELS:
            raise PayloadTooLarge(
                f"{where}: a {width}x{height} picture, past {MAX_PIXELS} pixels",
                field=where,
                value=f"{width}x{height}",
                allowed=f"pictures of at most {MAX_PIXELS} pixels",
            )
        try:
            picture = opened.convert("RGB")
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:  # truncated or corrupt data
            raise _unreadable(where, data, error) from None
    if image.resize is not None:
        scale = image.resize / min(width, height)
        size = (image.resize, round(height * scale)) if width <= height else (round(width * scale), image.resize)
        picture = picture.resize(size, Image.Resampling.BILINEAR)
        width, height = size
    crop_height, crop_width = image.crop
    if width < crop_width or height < crop_height:
        raise InvalidInput(
            f"{where}: a {width}x{height} picture is smaller than the model's {crop_width}x{crop_height} input"
            + ("" if image.resize is not None else " (push with --image resize=N to resize pictures first)"),
            field=where,
            value=f"{width}x{height}",
            allowed=f"pictures of at least {crop_width}x{crop_height} pixels",
        )
    left, top = round((width - crop_width) / 2.0), round((height - crop_height) / 2.0)
    return np.asarray(picture.crop((left, top, left + crop_width, top + crop_height)), dtype=np.uint8)


def _unreadable(where: str, data: bytes, error: BaseException) -> InvalidInput:
    reason = " ".join(str(error).split())[:160] or type(error).__name__
    return InvalidInput(
        f"{where}: not a JPEG, PNG or WebP picture ({reason})",
        field=where,
        value=f"{len(data)} bytes starting {data[:8]!r}",
        allowed=ACCEPTED,
    )
