"""What decoding and preprocessing a picture cost, one core: Pillow (what servestack's `--image` uses) against the
same steps inside the graph with onnxruntime-extensions' DecodeImage (OpenCV's decoder) and ONNX's Resize.

    python -m bench.image_decoders [--seconds 3]      (needs onnxruntime-extensions: pip install onnxruntime-extensions)

Pictures: 640x480 JPEGs (quality 90) and PNGs, as bench/images.py makes them; preprocessing: the shorter side to 72
(bilinear), the centre 64x64, scaled and normalised, NCHW float32. It prints milliseconds per picture; it never
passes or fails on time.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
from PIL import Image

from bench.images import MEAN, STD, photos

# onnxruntime-extensions 0.15 registers its image ops in this domain (not ai.onnx.contrib, its default).
CONTRIB = "com.microsoft.extensions"
OPSETS = [helper.make_opsetid("", 18), helper.make_opsetid(CONTRIB, 1)]
IR_VERSION = 9  # what every onnxruntime since 1.15 reads


def per_call_ms(work: Callable[[], object], seconds: float) -> float:
    for _ in range(5):
        work()
    slices = []
    for _ in range(3):
        calls, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds / 3:
            work()
            calls += 1
        slices.append((time.perf_counter() - started) * 1000 / calls)
    return statistics.median(slices)


def in_graph_model(width: int, height: int) -> bytes:
    """bytes -> DecodeImage (BGR HWC uint8) -> RGB -> float -> Resize (shorter side 72) -> centre 64 -> normalise ->
    NCHW [1, 3, 64, 64]. The picture's size is fixed here (the bench's pictures share it)."""
    scale = 72 / min(width, height)
    resized = (round(height * scale), round(width * scale))
    top, left = round((resized[0] - 64) / 2), round((resized[1] - 64) / 2)
    constant = helper.make_tensor
    nodes = [
        helper.make_node("DecodeImage", ["image"], ["bgr"], domain=CONTRIB),
        helper.make_node("Slice", ["bgr", "c_start", "c_end", "c_axis", "c_step"], ["rgb"]),  # BGR -> RGB
        helper.make_node("Cast", ["rgb"], ["pixels"], to=TensorProto.FLOAT),
        helper.make_node("Transpose", ["pixels"], ["chw"], perm=[2, 0, 1]),
        helper.make_node("Unsqueeze", ["chw", "axis0"], ["nchw"]),
        helper.make_node("Resize", ["nchw", "", "", "sizes"], ["resized"], mode="linear", antialias=1),
        helper.make_node("Slice", ["resized", "crop_start", "crop_end", "crop_axes"], ["cropped"]),
        helper.make_node("Mul", ["cropped", "scale"], ["scaled"]),
        helper.make_node("Sub", ["scaled", "shift"], ["out"]),
    ]
    initializers = [
        constant("c_start", TensorProto.INT64, [1], [-1]),
        constant("c_end", TensorProto.INT64, [1], [-(2**62)]),
        constant("c_axis", TensorProto.INT64, [1], [2]),
        constant("c_step", TensorProto.INT64, [1], [-1]),
        constant("axis0", TensorProto.INT64, [1], [0]),
        constant("sizes", TensorProto.INT64, [4], [1, 3, *resized]),
        constant("crop_start", TensorProto.INT64, [2], [top, left]),
        constant("crop_end", TensorProto.INT64, [2], [top + 64, left + 64]),
        constant("crop_axes", TensorProto.INT64, [2], [2, 3]),
        constant("scale", TensorProto.FLOAT, [1, 3, 1, 1], (1 / 255 / STD).tolist()),
        constant("shift", TensorProto.FLOAT, [1, 3, 1, 1], (MEAN / STD).tolist()),
    ]
    graph = helper.make_graph(
        nodes,
        "decode",
        [helper.make_tensor_value_info("image", TensorProto.UINT8, [None])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 3, 64, 64])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=OPSETS, ir_version=IR_VERSION)
    return bytes(model.SerializeToString())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    from onnxruntime_extensions import get_library_path

    from servestack.inference import images
    from servestack.inference.image_spec import ImageSpec

    spec = ImageSpec(input="image", layout="NCHW", crop=(64, 64), resize=72, mean=tuple(MEAN), std=tuple(STD))
    jpeg = photos(1)[0]
    buffer = io.BytesIO()
    Image.open(io.BytesIO(jpeg)).save(buffer, format="PNG")
    png = buffer.getvalue()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.register_custom_ops_library(get_library_path())
    session = ort.InferenceSession(in_graph_model(640, 480), options, providers=["CPUExecutionProvider"])
    decode_only = decoder_session(options)
    steps: dict[str, Callable[[bytes], object]] = {
        "Pillow: decode to RGB": lambda data: Image.open(io.BytesIO(data)).convert("RGB"),
        "Pillow: decode + resize + crop + normalize (servestack)": lambda data: images.image_rows(
            [("body", data)], spec, np.dtype(np.float32), 1
        ),
        "onnxruntime-extensions: DecodeImage alone": lambda data: decode_only.run(
            None, {"image": np.frombuffer(data, np.uint8)}
        ),
        "onnxruntime-extensions: decode + Resize + crop + normalize in the graph": lambda data: session.run(
            None, {"image": np.frombuffer(data, dtype=np.uint8)}
        ),
    }
    print("| ms per 640x480 picture, one core | JPEG | PNG |")
    print("| --- | --- | --- |")
    for name, step in steps.items():
        cells = [per_call_ms(lambda data=data, step=step: step(data), args.seconds) for data in (jpeg, png)]
        print(f"| {name} | {cells[0]:.2f} | {cells[1]:.2f} |")
    ours = images.image_rows([("body", jpeg)], spec, np.dtype(np.float32), 1)
    graph = session.run(None, {"image": np.frombuffer(jpeg, dtype=np.uint8)})[0]
    print(f"\nlargest difference between the two preprocessed tensors (JPEG): {np.abs(ours - graph).max():.3f}")


def decoder_session(options: ort.SessionOptions) -> ort.InferenceSession:
    graph = helper.make_graph(
        [helper.make_node("DecodeImage", ["image"], ["bgr"], domain=CONTRIB)],
        "decode_only",
        [helper.make_tensor_value_info("image", TensorProto.UINT8, [None])],
        [helper.make_tensor_value_info("bgr", TensorProto.UINT8, [None, None, 3])],
    )
    model = helper.make_model(graph, opset_imports=OPSETS, ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


if __name__ == "__main__":
    main()
