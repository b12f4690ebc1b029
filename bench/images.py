"""Image models on one core: photo-sized JPEG bodies through servestack's decoding, preprocessing and the model
(`models push --image`, no hook), against raw onnxruntime on the same decoded tensors at the same batch, and
against the same work written by hand (Pillow, numpy, onnxruntime, no servestack); and what decoding and
preprocessing cost per picture next to the model's own run.

    .venv/bin/python -m bench.images [--model cnn|resnet18] [--seconds 3] [--batch 8]

The model is the CNN of tests/fixtures/deep_learning (export_image.py, input [N, 3, 64, 64]; the pictures resized to
a shorter side of 72 and centre-cropped to 64), or with `--model resnet18` a ResNet-18-shaped model
(bench/resnet.py: input [N, 3, 224, 224], resized to 256 and cropped to 224, as torchvision's ImageNet models take
them), the size of model the target of 0.8 against raw onnxruntime is about. The pictures are 640x480 JPEGs (quality
90), normalised by ImageNet's mean and std. Ours is `ServedModel.infer` in this process (the pipeline every mode
calls; the transports are bench/realtime.py's): raw `image/jpeg` bodies at batch 1, base64 JSON of `--batch`
pictures. onnxruntime uses one intra-op thread and the process is pinned to one core. It prints figures and ratios;
it never passes or fails on time.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import orjson
from PIL import Image

from bench.resnet import write_resnet18
from servestack.inference import images
from servestack.inference.packaging import build_package
from servestack.inference.push_images import image_options
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from servestack.local.hosting.processes import REPO_ROOT

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "deep_learning"
NORMALIZE = "mean=0.485:0.456:0.406,std=0.229:0.224:0.225"
SIZES = {"cnn": (72, 64), "resnet18": (256, 224)}  # model -> (the shorter side resized to, the centre crop)
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def photos(count: int) -> list[bytes]:
    """640x480 JPEGs of smooth gradients and noise: a photo's size and a JPEG's usual work per pixel."""
    generator = np.random.default_rng(0)
    y, x = np.mgrid[0:480, 0:640].astype(np.float32)
    found = []
    for _ in range(count):
        base = np.stack([127 + 100 * np.sin(x * f + y * g) for f, g in generator.uniform(0.005, 0.05, (3, 2))], -1)
        pixels = np.clip(base + generator.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        found.append(buffer.getvalue())
    return found


def rate(work: Callable[[], object], items: int, seconds: float) -> float:
    """Items per second of `work` (each call does `items`), the median of 3 slices after a warm-up."""
    for _ in range(5):
        work()
    slices = []
    for _ in range(3):
        calls, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds / 3:
            work()
            calls += 1
        slices.append(calls * items / (time.perf_counter() - started))
    return statistics.median(slices)


def by_hand(data: bytes, resize: int, crop: int) -> np.ndarray:
    """The preprocessing as a user writes it without servestack: [3, crop, crop] float32."""
    with Image.open(io.BytesIO(data)) as opened:
        picture = opened.convert("RGB")
    width, height = picture.size
    scale = resize / min(width, height)
    size = (resize, round(height * scale)) if width <= height else (round(width * scale), resize)
    picture = picture.resize(size, Image.Resampling.BILINEAR)
    left, top = round((size[0] - crop) / 2), round((size[1] - crop) / 2)
    pixels = np.asarray(picture.crop((left, top, left + crop, top + crop)), dtype=np.float32) / 255.0
    return ((pixels - MEAN) / STD).transpose(2, 0, 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time of each figure")
    parser.add_argument("--batch", type=int, default=8, help="pictures per base64 JSON request")
    parser.add_argument("--model", choices=sorted(SIZES), default="cnn", help="the fixture CNN, or a ResNet-18 shape")
    args = parser.parse_args(argv)
    resize, crop = SIZES[args.model]
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    pictures = photos(args.batch)
    with tempfile.TemporaryDirectory(prefix="bench-images-") as scratch:
        package = Path(scratch) / "cnn"
        onnx_file = FIXTURES / "cnn.onnx" if args.model == "cnn" else write_resnet18(Path(scratch) / "resnet18.onnx")
        preprocess = f"resize={resize},crop={crop},{NORMALIZE}"
        build_package(onnx_file, package, name="cnn", version="1", image=image_options(preprocess))
        settings = ServingSettings(model_dir=package, default_model="cnn", providers="CPUExecutionProvider")
        served = ServedModel.load(package, settings)
        session = ort.InferenceSession(
            str(package / "model.onnx"),
            sess_options=_one_thread(),
            providers=["CPUExecutionProvider"],
        )
        spec = served.manifest.image
        assert spec is not None
        batch_body = orjson.dumps({"instances": [{"b64": base64.b64encode(p).decode()} for p in pictures]})
        one = images.image_rows([("body", pictures[0])], spec, np.dtype(np.float32), 1)
        many = images.image_rows([("body", p) for p in pictures], spec, np.dtype(np.float32), args.batch)
        seconds, batch = args.seconds, args.batch
        decode = rate(lambda: Image.open(io.BytesIO(pictures[0])).convert("RGB"), 1, seconds)
        steps = rate(lambda: images.image_rows([("body", pictures[0])], spec, np.dtype(np.float32), 1), 1, seconds)
        figures = {
            "ours, raw image/jpeg, batch 1": rate(lambda: served.infer(pictures[0], "image/jpeg", None), 1, seconds),
            "raw onnxruntime, decoded, batch 1": rate(lambda: session.run(None, {"image": one}), 1, seconds),
            "by hand (Pillow+numpy+ort), batch 1": rate(
                lambda: session.run(None, {"image": by_hand(pictures[0], resize, crop)[None]}), 1, seconds
            ),
            f"ours, b64 JSON, batch {batch}": rate(
                lambda: served.infer(batch_body, "application/json", None), batch, seconds
            ),
            f"raw onnxruntime, decoded, batch {batch}": rate(
                lambda: session.run(None, {"image": many}), batch, seconds
            ),
            f"by hand (Pillow+numpy+ort), batch {batch}": rate(
                lambda: session.run(None, {"image": np.stack([by_hand(p, resize, crop) for p in pictures])}),
                batch,
                seconds,
            ),
        }
    print(
        f"| pictures/s, one core ({len(pictures[0]) // 1000} kB 640x480 JPEG -> {crop}x{crop}, {args.model}) | value |"
    )
    print("| --- | --- |")
    for name, value in figures.items():
        print(f"| {name} | {value:,.0f} |")
    print(f"\nPillow decode of one picture: {1000 / decode:.2f} ms")
    print(f"decode + resize + crop + normalize of one picture (images.image_rows): {1000 / steps:.2f} ms")
    model_rate = figures[f"raw onnxruntime, decoded, batch {batch}"]
    print(f"the model's run, per picture at batch {batch}: {1000 / model_rate:.3f} ms")
    for size in (1, batch):
        ours = figures[next(name for name in figures if name.startswith("ours") and name.endswith(f"batch {size}"))]
        raw = figures[f"raw onnxruntime, decoded, batch {size}"]
        hand = figures[f"by hand (Pillow+numpy+ort), batch {size}"]
        print(
            f"batch {size}: ours / by hand {ours / hand:.2f} (target >= 0.8); ours / raw onnxruntime on decoded "
            f"tensors {ours / raw:.2f} (target >= 0.8: what decoding leaves of the model's rate)"
        )


def _one_thread() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return options


if __name__ == "__main__":
    main()
