"""What quantized weights cost and whether they are stored right.

:func:`accuracy_cost` measures a quantized model against the float one on a few seeded calls:
for a model whose first output holds scores (an LM's logits ``[batch, seq, vocab]``, a
classifier's ``[batch, classes]``) the top-1 agreement of the prediction at every position
(for an LM, the next token after each prefix), and the largest absolute error of that output.

:func:`verify_quantized` (``ONNXProgram.verify`` of a quantized program) checks the rewrite
itself: the quantized graph against the same graph computing in float with the weights its
integers stand for (:func:`~dynexport.quantize.graph.dequantized_model`), at the float
tolerances, and adds the accuracy cost against the float model to the report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from dynexport import files
from dynexport.quantize.graph import MS_DOMAIN, dequantized_model
from dynexport.signature import split_legacy_args
from dynexport.verification import VerificationReport, float32_without_tf32, verify_program

if TYPE_CHECKING:
    from dynexport.program import ONNXProgram

__all__ = ["AccuracyCost", "accuracy_cost", "seeded_calls", "verify_quantized"]

# accuracy_level 2..4 let MatMulNBits compute the activations in fp16, bf16 or int8 on purpose.
_EXACT_ACCURACY_LEVELS = (0, 1)


@dataclasses.dataclass(frozen=True)
class AccuracyCost:
    """A quantized model against its float model.

    Attributes:
        calls: how many calls were compared.
        predictions: how many top-1 predictions were compared (positions of every call), 0 when
            the first output holds no scores (rank < 2 or not float).
        top1_agreement: the fraction of those predictions that agree (None when 0 compared).
        max_abs_error: the largest absolute difference of the first output (for an LM, the max
            logit error).
        reference_max_abs: the largest magnitude of the float model's first output, the scale
            of that error.
    """

    calls: int
    predictions: int
    top1_agreement: float | None
    max_abs_error: float
    reference_max_abs: float

    def __str__(self) -> str:
        text = (
            f"max abs error {self.max_abs_error:.4g} (float outputs up to {self.reference_max_abs:.4g}) "
            f"over {self.calls} seeded calls"
        )
        if self.top1_agreement is not None:
            agreed = round(self.top1_agreement * self.predictions)
            text = f"top-1 agreement {self.top1_agreement:.1%} ({agreed}/{self.predictions} positions), " + text
        return text


def seeded_calls(
    args: tuple, kwargs: Mapping[str, Any] | None = None, *, count: int = 4, seed: int = 0
) -> list[tuple[tuple, dict]]:
    """The call ``(args, kwargs)`` and ``count - 1`` variations of it drawn from ``seed``: float
    tensors redrawn from a normal distribution of the example's mean and spread, integer
    tensors holding more than two distinct values (token ids) redrawn uniformly over the
    example's range; masks, flags and everything else kept."""
    generator = torch.Generator().manual_seed(seed)

    def redraw(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dtype.is_floating_point and tensor.numel() > 1:
            drawn = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
            spread = tensor.float().std().clamp_min(1e-3)
            return (drawn.to(tensor.device) * spread + tensor.float().mean()).to(tensor.dtype)
        if not tensor.dtype.is_floating_point and tensor.dtype != torch.bool and tensor.unique().numel() > 2:
            low, high = int(tensor.min()), int(tensor.max())
            drawn = torch.randint(low, high + 1, tensor.shape, generator=generator, dtype=tensor.dtype)
            return drawn.to(tensor.device)
        return tensor

    kwargs = dict(kwargs or {})
    calls = [(tuple(args), kwargs)]
    for _ in range(count - 1):
        calls.append(pytree.tree_map_only(torch.Tensor, redraw, (tuple(args), kwargs)))
    return calls


def accuracy_cost(
    quantized: Callable[..., Any], reference: Callable[..., Any], calls: Sequence[tuple[tuple, Mapping[str, Any]]]
) -> AccuracyCost:
    """Run both models on each call and compare their first outputs (see :class:`AccuracyCost`).

    Args:
        quantized: the quantized model (an ``ONNXProgram``, or any callable).
        reference: the float model (the eager ``nn.Module``, or the float ``ONNXProgram``).
        calls: ``(args, kwargs)`` pairs, e.g. from :func:`seeded_calls`.
    """
    agreed = predictions = 0
    max_abs_error = reference_max_abs = 0.0
    for args, kwargs in calls:
        with torch.no_grad(), float32_without_tf32():
            # .cpu(): the float model may run on a GPU, onnxruntime returns CPU tensors.
            expected = _first_tensor(reference(*_cloned(args), **_cloned(dict(kwargs)))).cpu()
            actual = _first_tensor(quantized(*_cloned(args), **_cloned(dict(kwargs)))).cpu()
        if actual.shape != expected.shape:
            raise ValueError(
                f"the quantized model's first output is {list(actual.shape)}, the float one's {list(expected.shape)}"
            )
        error = (actual.double() - expected.double()).abs()
        if error.numel():
            max_abs_error = max(max_abs_error, float(error.max()))
            reference_max_abs = max(reference_max_abs, float(expected.double().abs().max()))
        if expected.dtype.is_floating_point and expected.dim() >= 2 and expected.shape[-1] > 1:
            agreed += int((actual.argmax(-1) == expected.argmax(-1)).sum())
            predictions += expected[..., 0].numel()
    top1_agreement = agreed / predictions if predictions else None
    return AccuracyCost(len(calls), predictions, top1_agreement, max_abs_error, reference_max_abs)


def _first_tensor(outputs: Any) -> torch.Tensor:
    leaves = [leaf for leaf in pytree.tree_leaves(outputs) if isinstance(leaf, torch.Tensor)]
    if not leaves:
        raise ValueError("the model returned no tensor to compare")
    return leaves[0].detach()


def _cloned(tree: Any) -> Any:
    return pytree.tree_map_only(torch.Tensor, torch.clone, tree)


def verify_quantized(
    program: ONNXProgram,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    model: Any = None,
    resized: Any = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> VerificationReport:
    """Check a quantized program's graph against its float twin with the dequantized weights
    (every output, at the float tolerances, also at ``resized`` inputs), and measure its
    :class:`AccuracyCost` against the float ``model`` (by default the exported program run
    eagerly) on seeded variations of the inputs. The report's ``accuracy`` holds the cost.

    A program whose ``MatMulNBits`` compute the activations in lower precision (accuracy_level
    2 to 4) is checked with the same stored weights at accuracy_level 0, and onnxruntime's
    fusion of ``DequantizeLinear`` + ``MatMul`` into ``MatMulNBits`` (at accuracy level 4 by
    default) is told to keep the activations in float; the cost is measured on the program as
    it runs.
    """
    if not args and not kwargs:
        example = program.exported_program.example_inputs if program.exported_program is not None else None
        if not example:
            raise ValueError("no inputs to verify with: pass the example arguments to verify()")
        args, kwargs = example
    args, kwargs = split_legacy_args(tuple(args), kwargs)
    if model is None:
        model = _eager_float_model(program)
    exact = program.with_model(_at_exact_accuracy(program.model), session_options=_exact_session_options())
    reference = program.with_model(dequantized_model(program.model))
    report = verify_program(exact, args, kwargs, model=reference, resized=resized, rtol=rtol, atol=atol)
    report.program = program
    report.accuracy = accuracy_cost(program, model, seeded_calls(args, kwargs))
    return report


def _eager_float_model(program: ONNXProgram) -> Any:
    exported = program.exported_program
    if exported is None:
        raise ValueError("this program has no exported program to run eagerly; pass the float model as model=")
    tensors = [*exported.state_dict.values(), *exported.constants.values()]
    if not all(files.has_data(t) for t in tensors if isinstance(t, torch.Tensor)):
        raise ValueError(
            "the exported program's weights are on the meta device or fake; pass the float model with real "
            "weights as model="
        )
    return exported.module()


def _exact_session_options() -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    return options


def _at_exact_accuracy(model: Any) -> Any:
    """``model``, or a copy whose MatMulNBits compute the activations in their own float type."""
    if not any(_lowers_activations(node) for node in model.graph):
        return model
    copy = model.clone()
    for node in copy.graph:
        if _lowers_activations(node):
            del node.attributes["accuracy_level"]
    return copy


def _lowers_activations(node: Any) -> bool:
    level = node.attributes.get("accuracy_level") if node.domain == MS_DOMAIN and node.op_type == "MatMulNBits" else None
    return level is not None and level.as_int() not in _EXACT_ACCURACY_LEVELS
