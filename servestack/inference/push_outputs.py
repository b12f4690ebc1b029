"""`models push --outputs ROLE[=OUTPUT]` and `--top-k K`: which output holds a classifier's class scores, declared at
push (or inferred where that is unambiguous), and the checks of `--labels` against its classes.

- `logits`: raw scores; answers carry their softmax as `probabilities`, their argmax as `predictions`;
- `probabilities`: scores summing to 1; answers carry their argmax as `predictions` when no output predicts.
Without `--outputs`, an output named `logits` (float, `[N, K]`) is the logits and one named `probabilities` (or
skl2onnx's `output_probability`) the probabilities. `--labels` names the classes of that output, exactly as many;
a model whose classes no output says, but that has a float `[N, K]` output, is asked which role it has rather
than answered with labels that name its scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servestack.inference.errors import InvalidInput
from servestack.inference.manifest import TensorSpec

ROLES = ("logits", "probabilities")
_FORM = "logits or probabilities, optionally =OUTPUT (the output's name; default: the model's only output)"


@dataclass(frozen=True)
class ClassOutputs:
    """The outputs' roles as the manifest records them."""

    prediction_output: str | None
    probability_output: str | None
    logits_output: str | None
    top_k: int | None


def parse_role(text: str | None) -> tuple[str, str | None] | None:
    """`--outputs`'s text -> (role, output name or None)."""
    if text is None:
        return None
    role, _, output = (part.strip() for part in text.partition("="))
    if role.lower() not in ROLES:
        raise InvalidInput(f"--outputs: {text!r} is not a role", field="--outputs", value=text, allowed=_FORM)
    return role.lower(), output or None


def class_outputs(
    outputs: Sequence[TensorSpec],
    *,
    role: tuple[str, str | None] | None,
    top_k: int | None,
    labels: Sequence[str | int] | None,
    labels_given: bool,
    prediction_output: str | None,
    probability_output: str | None,
) -> ClassOutputs:
    """The roles of `outputs`: `prediction_output` and `probability_output` as found by name (packaging.py), with
    the declared or inferred role, checked against `--labels` and `--top-k`."""
    names = [spec.name for spec in outputs]
    logits_output: str | None = None
    if role is not None:
        kind, output = role
        if output is None:
            if len(names) != 1:
                raise InvalidInput(
                    f"--outputs {kind}: the model has {len(names)} outputs {names}; say which: --outputs {kind}=OUTPUT",
                    field="--outputs",
                    value=kind,
                    allowed=f"{kind}=OUTPUT, OUTPUT one of {names}",
                )
            output = names[0]
        if output not in names:
            raise InvalidInput(
                f"--outputs: {output!r} is not one of the outputs {names}", field="--outputs", value=output
            )
        spec = next(spec for spec in outputs if spec.name == output)
        if not spec.dtype.startswith("float") or len(spec.shape) != 2:
            raise InvalidInput(
                f"--outputs {kind}={output}: {output!r} is {spec.dtype} {list(spec.shape)}; class scores are float "
                "[N, classes]",
                field="--outputs",
                value=output,
            )
        if kind == "logits":
            logits_output = output
            probability_output = None if probability_output == output else probability_output
        else:
            probability_output = output
        if prediction_output == output:
            prediction_output = None
    elif probability_output is None and prediction_output is None and "logits" in names:
        spec = next(spec for spec in outputs if spec.name == "logits")
        if spec.dtype.startswith("float") and len(spec.shape) == 2:
            logits_output = "logits"
    scores = logits_output or probability_output
    if scores is None and (labels_given or top_k is not None):
        candidates = [spec.name for spec in outputs if spec.dtype.startswith("float") and len(spec.shape) == 2]
        if candidates and prediction_output is None:
            flag = "--labels" if labels_given else "--top-k"
            raise InvalidInput(
                f"{flag}: no output is known to hold class scores; say which: --outputs logits={candidates[0]} "
                f"or --outputs probabilities={candidates[0]}",
                field="--outputs",
                allowed=_FORM,
            )
        if top_k is not None:
            raise InvalidInput("--top-k: the model has no output of class scores", field="--top-k", value=top_k)
    classes = None
    if scores is not None:
        shape = next(spec.shape for spec in outputs if spec.name == scores)
        classes = shape[-1] if len(shape) >= 2 else None
    if labels is not None and labels_given and classes is not None and classes != len(labels):
        raise InvalidInput(
            f"--labels: {len(labels)} labels given, but the model's {scores!r} has {classes} classes",
            field="labels",
            value=",".join(map(str, labels)),
            allowed=f"{classes} comma-separated labels, in class id order",
        )
    if top_k is not None and (top_k < 1 or (classes is not None and top_k > classes)):
        raise InvalidInput(
            f"--top-k: {top_k}, but the model's {scores!r} has {classes} classes",
            field="--top-k",
            value=top_k,
            allowed=f"1..{classes}",
        )
    return ClassOutputs(prediction_output, probability_output, logits_output, top_k)
