"""Classes from class scores: a classifier whose graph ends in logits, or in probabilities alone, answers with the
class it predicts, as a classifier whose graph predicts it does.

- `logits_output` (`models push --outputs logits`): the answer's `probabilities` are the logits' softmax (in
  float32, whatever the model's float), `predictions` their argmax (class ids), `labels` the argmax's labels;
- a single `probability_output` and no prediction output: `predictions` are the probabilities' argmax;
- `top_k`: JSON answers add each row's k most probable classes, best first.

The scores are turned into a prediction output and a probability output before the answer is written
(`ClassRoles.derive`), so the answer itself is written as any classifier's (servestack/inference/answers.py),
with `ClassRoles.manifest` describing those outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from servestack.inference.answers import label_lookup
from servestack.inference.manifest import Manifest, TensorSpec

# The derived prediction output's name: not an ONNX name a graph would hold (the answer calls it `predictions`).
PREDICTED_CLASS = "servestack:class"


@dataclass(frozen=True, slots=True)
class ClassRoles:
    scores: str  # the output holding one score per class
    logits: bool  # True: raw scores, turned into probabilities by a softmax
    top_k: int | None
    manifest: Manifest  # the package's manifest, its outputs as `derive` gives them

    def derive(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`outputs` with the class ids (`PREDICTED_CLASS`) first and the scores as probabilities."""
        scores = outputs[self.scores]
        probabilities = softmax(scores) if self.logits else scores
        derived = {PREDICTED_CLASS: np.argmax(scores, axis=-1), self.scores: probabilities}
        if len(outputs) > 1:
            derived.update((name, value) for name, value in outputs.items() if name != self.scores)
        return derived

    def top(self, probabilities: np.ndarray) -> list[list[dict[str, Any]]]:
        """Each row's `top_k` classes, most probable first: class id, label (when the package has labels) and
        probability."""
        assert self.top_k is not None
        k = min(self.top_k, probabilities.shape[-1])
        best = np.argsort(-probabilities, axis=-1, kind="stable")[:, :k]
        lookup = label_lookup(self.manifest.labels) if self.manifest.labels is not None else None
        rows = []
        for row, classes in enumerate(best.tolist()):
            entries = []
            for class_id in classes:
                entry: dict[str, Any] = {"class": class_id}
                if lookup is not None:
                    entry["label"] = lookup.get(class_id, str(class_id))
                entry["probability"] = probabilities[row, class_id]
                entries.append(entry)
            rows.append(entries)
        return rows


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float32 (a float16 model's logits too: its probabilities then sum to 1 closely)."""
    shifted = logits.astype(np.float32) - logits.max(axis=-1, keepdims=True).astype(np.float32)
    exponentials = np.exp(shifted)
    result: np.ndarray = exponentials / exponentials.sum(axis=-1, keepdims=True)
    return result


def class_roles(manifest: Manifest) -> ClassRoles | None:
    """The roles of a manifest whose class scores need a prediction derived from them; None for any other."""
    if manifest.logits_output is not None:
        scores, logits = manifest.logits_output, True
    elif (
        manifest.probability_output is not None
        and manifest.prediction_output is None
        and manifest.outputs[0].name == manifest.probability_output
    ):
        # Without a prediction output, `primary_output` is the first output: probabilities that come first would
        # be the answer's predictions, so the prediction is derived from them.
        scores, logits = manifest.probability_output, False
    else:
        return None
    spec = next(spec for spec in manifest.outputs if spec.name == scores)
    if len(spec.shape) != 2:
        return None
    derived_outputs = (
        TensorSpec(PREDICTED_CLASS, "int64", (spec.shape[0],)),
        TensorSpec(scores, "float32" if logits else spec.dtype, spec.shape),
        *(other for other in manifest.outputs if other.name != scores),
    )
    derived = msgspec.structs.replace(
        manifest,
        outputs=derived_outputs,
        prediction_output=PREDICTED_CLASS,
        probability_output=scores,
        logits_output=None,
        top_k=None,
    )
    return ClassRoles(scores, logits, manifest.top_k, derived)
