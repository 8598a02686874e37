"""The graph rewrite: each product of an activation and a constant weight (``MatMul``, ``Gemm``)
and, if asked, each embedding lookup (``Gather`` of a constant table) of an onnx_ir model
becomes its quantized form; :func:`dequantized_model` reads those forms back into float weights.

Forms, by target:

- ``onnxruntime``: com.microsoft ``MatMulNBits`` (weight ``[N, blocks, block_size * bits / 8]``
  uint8, codes packed low bits first along K; scales ``[N * blocks]``; zero points packed the
  same way, ``[N * ceil(blocks * bits / 8)]``; a Gemm's 1-D bias as its bias input) and
  ``GatherBlockQuantized`` (table ``[V, H * bits / 8]`` uint8, scales ``[V, blocks]``). Without
  zero points both ops take ``2^(bits-1)`` as the zero point, so symmetric codes are stored
  shifted up by it.
- ``portable``: ``DequantizeLinear`` of an int4/int8 (uint4/uint8 with zero points) initializer
  then the float op. From opset 21 the scales are blocked (``block_size`` attribute); below it
  (int8 only) there is one scale per output feature (per vocabulary row for a table).

Only the main graph is rewritten; weights of If branches and Loop bodies stay float.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from typing import NamedTuple

import ml_dtypes
import numpy as np
import onnx_ir as ir
import torch

from dynexport.passes.onnx import remove_dead_code
from dynexport.passes.onnx.pack_matmuls import ConcatenatedTensor, pack_matmuls
from dynexport.passes.onnx.values import (
    add_initializer,
    constant_array,
    insert_replacement,
    producer,
    single_consumer,
)
from dynexport.quantize.weights import BLOCK_SIZES, KnownWeights, QuantizedWeight, WeightQuantization, weight_quantizer

__all__ = ["MS_DOMAIN", "QUANTIZATION_KEY", "dequantized_model", "quantization_of", "quantize_model"]

QUANTIZATION_KEY = "pkg.dynexport.weight_quantization"
MS_DOMAIN = "com.microsoft"
BLOCKED_DEQUANTIZE_OPSET = 21

_FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})
# Nodes between an output projection and the graph output that only move or relabel its values.
_PASS_THROUGH = frozenset({"Reshape", "Cast", "Identity", "Squeeze", "Unsqueeze"})


@dataclasses.dataclass(frozen=True)
class _WeightProduct:
    """``activation @ W.T (+ bias)`` with W ``[N, K]`` read from ``weight`` (stored ``[N, K]``
    when ``transposed``, else ``[K, N]``); ``bias_add``: the Add of a constant ``[N]`` that alone
    reads a MatMul's result, which MatMulNBits can take as its bias."""

    node: ir.Node
    activation: ir.Value
    weight: ir.Value
    transposed: bool
    bias: ir.Value | None
    bias_add: ir.Node | None = None


def quantization_of(model: ir.Model) -> dict | None:
    """The :class:`WeightQuantization` fields a model was quantized with, or None."""
    text = model.metadata_props.get(QUANTIZATION_KEY)
    return json.loads(text) if text else None


def quantize_model(model: ir.Model, config: WeightQuantization, known: KnownWeights | None = None) -> int:
    """Rewrite ``model`` in place; return how many weight tensors were quantized.

    With ``known`` (a model quantized before the export, dynexport/quantize/torchao.py), the
    products and lookups of exactly those weights are rewritten, each from its own integers,
    bits and block size; ``config`` gives only the target and the accuracy level.

    Raises:
        ValueError: the model is already quantized, the target cannot express ``config`` (or a
            known weight) at the model's opset, or there is no weight to quantize.
    """
    if quantization_of(model) is not None:
        raise ValueError("the model's weights are already quantized; quantize the float program instead")
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    blocked = config.target == "onnxruntime" or opset >= BLOCKED_DEQUANTIZE_OPSET
    if known is None:
        _check_portable_opset(config, opset, blocked)
    graph = model.graph
    rewrite = _Rewriter(graph, config, blocked, opset, known)
    # Products of one activation (q, k, v; gate, up) as one: one MatMulNBits per group.
    if known is None:
        pack_matmuls(graph, opset=opset, accept=lambda matmul: config.lm_head or not _reaches_an_output(matmul))
    else:
        pack_matmuls(graph, opset=opset, accept=lambda matmul: rewrite.layout(matmul.inputs[1], False) is not None)
    if known is None:
        products = [p for p in _weight_products(graph) if config.lm_head or not _is_output_projection(p)]
        tables = [t for t in _embedding_tables(graph) if _table_fits(t, config)] if config.embedding else []
    else:
        products = [p for p in _weight_products(graph) if rewrite.layout(p.weight, p.transposed) is not None]
        tables = [t for t in _embedding_tables(graph) if rewrite.layout(t.inputs[0], True) is not None]
    if not products and not tables:
        if known is not None:
            return 0
        raise ValueError(
            "the model has no weight to quantize: no MatMul or Gemm multiplies an activation by a constant "
            "2-D float weight" + ("" if config.embedding else " (embeddings are left out unless embedding=True)")
            + ("" if config.lm_head else " (output projections are left out with lm_head=False)")
        )
    # The largest weight first, beside no stored weight yet: its integers are the largest
    # temporary (a 135M decoder's tied LM head: 28 MB, 0.05x of its float weights).
    weights = [(p.weight, p.transposed, p.node) for p in products] + [(t.inputs[0], True, t) for t in tables]
    rewrite.quantize_ahead(*max(weights, key=lambda weight: weight[0].const_value.size))
    for product in products:
        rewrite.product(product)
    for gather in tables:
        rewrite.table(gather)
    remove_dead_code(graph)
    if any(node.domain == MS_DOMAIN for node in graph):
        model.opset_imports[MS_DOMAIN] = 1
    if known is None:
        metadata = {**config.metadata(), "blocked": blocked}
    else:
        metadata = {"source": known.source, "target": config.target, "accuracy_level": config.accuracy_level}
    model.metadata_props[QUANTIZATION_KEY] = json.dumps(metadata)
    return len(rewrite.quantized)


def _check_portable_opset(config: WeightQuantization, opset: int, blocked: bool) -> None:
    if not blocked and config.bits == 4:
        raise ValueError(
            f"int4 weights in the portable target need DequantizeLinear with int4 and block_size, "
            f"from opset {BLOCKED_DEQUANTIZE_OPSET}; the model is at opset {opset}. Export with "
            f"opset_version={BLOCKED_DEQUANTIZE_OPSET} or higher, use bits=8 (one scale per output "
            "feature below opset 21) or target='onnxruntime'"
        )
    if not blocked:
        warnings.warn(
            f"opset {opset} has no blocked DequantizeLinear (opset {BLOCKED_DEQUANTIZE_OPSET}): int8 weights get "
            f"one scale per output feature instead of one per {config.block_size} weights",
            stacklevel=4,
        )


def _weight_products(graph: ir.Graph):
    for node in list(graph):
        if node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
            continue
        if node.op_type == "MatMul":
            activation, weight = node.inputs
            bias, transposed = None, False
        elif node.op_type == "Gemm" and _plain_gemm(node):
            activation, weight = node.inputs[:2]
            bias = node.inputs[2] if len(node.inputs) > 2 else None
            transposed = _int_attribute(node, "transB", 0) == 1
        else:
            continue
        transpose = producer(weight, "Transpose")
        if transpose is not None and list(transpose.attributes["perm"].as_ints()) == [1, 0]:
            weight, transposed = transpose.inputs[0], not transposed
        if _constant_matrix(weight) and activation.shape is not None and len(activation.shape) >= 2:
            columns = weight.const_value.shape[0 if transposed else 1]
            bias_add = _bias_add(node, columns) if node.op_type == "MatMul" else None
            yield _WeightProduct(node, activation, weight, transposed, bias, bias_add)


def _bias_add(matmul: ir.Node, columns: int) -> ir.Node | None:
    add = single_consumer(matmul.outputs[0])
    if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
        return None
    other = add.inputs[1] if add.inputs[0] is matmul.outputs[0] else add.inputs[0]
    array = constant_array(other)
    if array is None or array.shape != (columns,) or other.dtype != matmul.outputs[0].dtype:
        return None
    return add


def _plain_gemm(node: ir.Node) -> bool:
    """A Gemm computing ``A @ op(B) + C``: no transposed A, alpha and beta 1."""
    alpha = node.attributes.get("alpha")
    beta = node.attributes.get("beta")
    return (
        _int_attribute(node, "transA", 0) == 0
        and (alpha is None or alpha.as_float() == 1.0)
        and (beta is None or beta.as_float() == 1.0)
    )


def _int_attribute(node: ir.Node, name: str, default: int) -> int:
    attribute = node.attributes.get(name)
    return default if attribute is None else attribute.as_int()


def _constant_matrix(value: ir.Value) -> bool:
    return (
        value.const_value is not None and not value.is_graph_input()
        and value.dtype in _FLOAT_TYPES and len(value.const_value.shape) == 2
    )


def _is_output_projection(product: _WeightProduct) -> bool:
    return _reaches_an_output(product.node)


def _reaches_an_output(node: ir.Node) -> bool:
    """The node's result reaches a graph output through nodes that only move its values."""
    value = node.outputs[0]
    while not value.is_graph_output():
        uses = list(value.uses())
        if len(uses) != 1 or uses[0].node.op_type not in _PASS_THROUGH:
            return False
        value = uses[0].node.outputs[0]
    return True


def _embedding_tables(graph: ir.Graph):
    for node in list(graph):
        gather = node.op_type == "Gather" and node.domain in ("", "ai.onnx") and _int_attribute(node, "axis", 0) == 0
        if gather and _constant_matrix(node.inputs[0]):
            yield node


def _table_fits(gather: ir.Node, config: WeightQuantization) -> bool:
    """GatherBlockQuantized stores two 4-bit codes per byte of a row: an odd row length stays
    float, with a warning."""
    table = gather.inputs[0]
    if config.target == "onnxruntime" and config.bits == 4 and table.const_value.shape[1] % 2:
        warnings.warn(
            f"the embedding table {table.name} stays float: GatherBlockQuantized packs two 4-bit codes per "
            f"byte and its rows hold an odd number ({table.const_value.shape[1]}) of values; use bits=8 or "
            "target='portable' to quantize it",
            stacklevel=4,
        )
        return False
    return True


class _Layout(NamedTuple):
    """How a weight is quantized: ``bits``, ``block_size`` weights per scale along K, ``blocks``
    scales per output feature (1: per output feature)."""

    bits: int
    block_size: int
    blocks: int


def _matrix(value: ir.Value, transposed: bool, scratch: _Scratch) -> torch.Tensor:
    """A constant weight as float32 ``[N, K]``; a packed weight from its parts, whose rows are
    its rows (a part ``[K, N_i]`` is most often the transposed view of a parameter ``[N_i, K]``:
    read without a copy), written into ``scratch``."""
    tensor = value.const_value
    if isinstance(tensor, ConcatenatedTensor) and tensor.axis == (0 if transposed else 1):
        parts = [_rows(part, transposed) for part in tensor.parts]
        rows, k = sum(part.shape[0] for part in parts), parts[0].shape[1]
        return torch.cat(parts, out=scratch.matrix(rows, k))
    return _rows(tensor, transposed)


class _Scratch:
    """One float32 buffer for the packed weights' matrices, reused from one to the next. Made
    anew for each (7 MB for a 135M decoder's gate|up), they left holes in the heap between the
    stored integers that later ones did not fill: 0.19x of the float weights more at the peak."""

    def __init__(self):
        self._buffer = torch.empty(0, dtype=torch.float32)

    def matrix(self, rows: int, k: int) -> torch.Tensor:
        if self._buffer.numel() < rows * k:
            self._buffer = torch.empty(rows * k, dtype=torch.float32)
        return self._buffer[: rows * k].view(rows, k)


def _rows(tensor: ir.TensorProtocol, transposed: bool) -> torch.Tensor:
    matrix = torch.from_numpy(np.asarray(tensor.numpy(), dtype=np.float32))
    return (matrix if transposed else matrix.T).contiguous()


class _Rewriter:
    """Rewrites products and lookups one at a time; a weight read by several nodes in the same
    orientation and form is quantized and stored once. Only the stored forms are kept: the
    integers an algorithm returns (a byte a weight from round to nearest) live while one weight
    is converted."""

    def __init__(
        self, graph: ir.Graph, config: WeightQuantization, blocked: bool, opset: int, known: KnownWeights | None
    ):
        self.graph = graph
        self.config = config
        self.blocked = blocked
        self.opset = opset
        self.known = known
        self.quantizer = weight_quantizer(config.algorithm)
        self.layouts: dict[tuple[str, bool], _Layout | None] = {}
        self.quantized: set[tuple[str, bool]] = set()
        self.stored: dict[tuple[str, bool, str], tuple[ir.Value | None, ...]] = {}
        self.dequantized: dict[tuple[str, bool, str], ir.Value] = {}
        self.ahead: dict[tuple[str, bool, str], tuple[np.ndarray | None, ...]] = {}
        self.scratch = _Scratch()

    def layout(self, value: ir.Value, transposed: bool) -> _Layout | None:
        """How the weight ``[N, K]`` is quantized along K; None for a weight that is not known
        (with ``known``)."""
        key = (value.name, transposed)
        if key not in self.layouts:
            if self.known is not None:
                q = self.known.find(_matrix(value, transposed, self.scratch))
                self.layouts[key] = None if q is None else _Layout(q.bits, q.block_size, q.scales.shape[1])
            else:
                k = value.const_value.shape[1 if transposed else 0]
                block_size = self.config.block_size if self.blocked else k
                self.layouts[key] = _Layout(self.config.bits, block_size, -(-k // block_size))
        return self.layouts[key]

    def quantize(self, value: ir.Value, transposed: bool) -> QuantizedWeight:
        """The weight ``[N, K]`` quantized along K: a known weight's own integers, or the
        algorithm's."""
        self.quantized.add((value.name, transposed))
        matrix = _matrix(value, transposed, self.scratch)
        if self.known is not None:
            return self.known.find(matrix)
        layout = self.layout(value, transposed)
        return self.quantizer(
            matrix, bits=layout.bits, block_size=layout.block_size, symmetric=self.config.symmetric
        )

    def initializers(
        self, value: ir.Value, transposed: bool, form: str, arrays, reader: ir.Node
    ) -> tuple[ir.Value | None, ...]:
        """The stored form of a weight as initializers ``<weight>.<form>.quantized``, ``.scales``
        and ``.zero_points`` (None when symmetric), made once."""
        key = (value.name, transposed, form)
        if key not in self.stored:
            name = _weight_name(value, reader)
            stored = self.ahead.pop(key, None) or arrays(self.quantize(value, transposed))
            self.stored[key] = tuple(
                None if array is None else add_initializer(self.graph, array, f"{name}.{form}.{part}")
                for part, array in zip(("quantized", "scales", "zero_points"), stored)
            )
        return self.stored[key]

    def quantize_ahead(self, value: ir.Value, transposed: bool, reader: ir.Node) -> None:
        """Quantize a weight and make its stored arrays now, to be stored when its reader is
        rewritten (the same initializers, in the same order)."""
        form, arrays = self.storage(value, transposed, reader)
        self.ahead[(value.name, transposed, form)] = arrays(self.quantize(value, transposed))

    def storage(self, value: ir.Value, transposed: bool, reader: ir.Node):
        """The name of the weight's stored form (``nbits``, ``gbq``, ``dq``, ``table_dq``) and
        the function making its arrays from the quantized weight."""
        dtype = value.dtype
        form = self.form(self.layout(value, transposed), reader)
        blocked = form == "blocked"
        if reader.op_type == "Gather":
            if form == "nbits":
                return "gbq", lambda q: _gather_block_quantized_arrays(q, dtype)
            return "table_dq", lambda q: _dequantize_linear_arrays(q, dtype, blocked, transposed=False)
        if form == "nbits":
            return "nbits", lambda q: _matmul_nbits_arrays(q, dtype)
        return "dq", lambda q: _dequantize_linear_arrays(q, dtype, blocked, transposed=True)

    def form(self, q: _Layout, reader: ir.Node) -> str:
        """How a weight is stored: ``"nbits"`` (MatMulNBits, GatherBlockQuantized),
        ``"blocked"`` (DequantizeLinear with ``block_size``) or ``"per_axis"`` (DequantizeLinear
        with one scale per output feature). A known weight takes the onnxruntime ops where its
        block size is one of theirs, else DequantizeLinear, blocked from opset 21 (int4 too)."""
        if self.known is None:
            if self.config.target == "onnxruntime":
                return "nbits"
            return "blocked" if self.blocked else "per_axis"
        odd_table = reader.op_type == "Gather" and q.bits == 4 and q.block_size * q.blocks % 2
        if self.config.target == "onnxruntime" and q.block_size in BLOCK_SIZES and not odd_table:
            return "nbits"
        form = "blocked" if q.blocks > 1 else "per_axis"
        if self.opset < BLOCKED_DEQUANTIZE_OPSET and (q.bits == 4 or form == "blocked"):
            layout = f"in blocks of {q.block_size}" if form == "blocked" else "per output feature"
            raise ValueError(
                f"the weight {_weight_name(reader.inputs[0 if reader.op_type == 'Gather' else 1], reader)} was "
                f"quantized to {q.bits} bits {layout}, which DequantizeLinear expresses from opset "
                f"{BLOCKED_DEQUANTIZE_OPSET}; the model is at opset {self.opset}. Export with "
                f"opset_version={BLOCKED_DEQUANTIZE_OPSET} or higher"
            )
        return form

    # -- weight products -----------------------------------------------------------------------

    def product(self, product: _WeightProduct) -> None:
        replaced = product.node
        q = self.layout(product.weight, product.transposed)
        form = self.form(q, product.node)
        stored_form, arrays = self.storage(product.weight, product.transposed, product.node)
        if form == "nbits":
            stored = self.initializers(product.weight, product.transposed, stored_form, arrays, product.node)
            weight, scales, zero_points = stored
            n, k = product.weight.const_value.shape
            n, k = (n, k) if product.transposed else (k, n)
            bias = product.bias if _is_vector(product.bias, n) else None
            if product.bias_add is not None:
                replaced = product.bias_add
                bias = next(v for v in replaced.inputs if v is not product.node.outputs[0])
            attributes = {"K": k, "N": n, "bits": q.bits, "block_size": q.block_size}
            if self.config.accuracy_level:
                attributes["accuracy_level"] = self.config.accuracy_level
            inputs = [product.activation, weight, scales, zero_points, None, bias]
            while inputs[-1] is None:
                inputs.pop()
            nodes = [ir.Node(MS_DOMAIN, "MatMulNBits", inputs, _attributes(attributes))]
        else:
            # DequantizeLinear gives the weight as MatMul reads it: [K, N].
            weight = self._dequantized(
                product.weight, product.transposed, stored_form, arrays, axis=0, before=product.node,
                blocked=form == "blocked",
            )
            nodes = [ir.Node("", "MatMul", [product.activation, weight])]
            bias = None
        if product.bias is not None and bias is None:
            nodes.append(ir.Node("", "Add", [nodes[-1].outputs[0], product.bias]))
        self._replace(replaced, nodes)

    # -- embedding tables ----------------------------------------------------------------------

    def table(self, gather: ir.Node) -> None:
        table, indices = gather.inputs
        q = self.layout(table, True)
        form = self.form(q, gather)
        stored_form, arrays = self.storage(table, True, gather)
        if form == "nbits":
            shared = self._matmul_nbits_as_table(table, q, gather)
            data, scales, zero_points = shared or self.initializers(table, True, stored_form, arrays, gather)
            attributes = {"gather_axis": 0, "quantize_axis": 1, "block_size": q.block_size, "bits": q.bits}
            inputs = [data, indices, scales] + ([zero_points] if zero_points is not None else [])
            nodes = [ir.Node(MS_DOMAIN, "GatherBlockQuantized", inputs, _attributes(attributes))]
        else:
            dequantized = self._dequantized(
                table, True, stored_form, arrays, axis=1, before=gather, blocked=form == "blocked"
            )
            nodes = [ir.Node("", "Gather", [dequantized, indices], _attributes({"axis": 0}))]
        self._replace(gather, nodes)

    def _matmul_nbits_as_table(self, table: ir.Value, q: _Layout, before: ir.Node) -> tuple[ir.Value | None, ...] | None:
        """A table already stored for MatMulNBits (an embedding tied to the LM head) read by
        GatherBlockQuantized through Reshapes: both ops pack each row's codes low bits first
        with the same scales and zero points, so one copy serves both where K needs no padding."""
        stored = self.stored.get((table.name, True, "nbits"))
        rows, k = table.const_value.shape
        if stored is None or q.block_size * q.blocks != k:
            return None
        key = (table.name, True, "nbits_as_table")
        if key not in self.stored:
            self.stored[key] = tuple(
                None if value is None else self._reshaped(value, rows, before) for value in stored
            )
        return self.stored[key]

    def _reshaped(self, value: ir.Value, rows: int, before: ir.Node) -> ir.Value:
        """A constant read as ``[rows, size / rows]``."""
        shape = [rows, int(np.prod(value.const_value.shape)) // rows]
        target = add_initializer(self.graph, np.array(shape, np.int64), f"{value.name}.table_shape")
        node = ir.Node("", "Reshape", [value, target])
        node.outputs[0].dtype = value.dtype
        node.outputs[0].shape = ir.Shape(shape)
        self.graph.insert_before(before, node)
        return node.outputs[0]

    # -- shared --------------------------------------------------------------------------------

    def _dequantized(
        self, value: ir.Value, transposed: bool, form: str, arrays, *, axis: int, before: ir.Node, blocked: bool
    ) -> ir.Value:
        """The float weight, from a DequantizeLinear of its stored form (one per weight, before
        its first reader): blocked along ``axis`` from opset 21, else with one scale per index of
        the other axis; cast when its scales cannot have the weight's type."""
        key = (value.name, transposed, form)
        if key not in self.dequantized:
            weight, scales, zero_points = self.initializers(value, transposed, form, arrays, before)
            inputs = [weight, scales] + ([zero_points] if zero_points is not None else [])
            block_size = self.layout(value, transposed).block_size
            attributes = {"axis": axis, "block_size": block_size} if blocked else {"axis": 1 - axis}
            nodes = [ir.Node("", "DequantizeLinear", inputs, _attributes(attributes))]
            if scales.dtype != value.dtype:
                nodes.append(ir.Node("", "Cast", [nodes[0].outputs[0]], _attributes({"to": value.dtype})))
            for node in nodes:
                node.outputs[0].dtype = node.inputs[1].dtype if node.op_type == "DequantizeLinear" else value.dtype
                node.outputs[0].shape = ir.Shape(weight.shape)
                node.metadata_props.update(before.metadata_props)
                self.graph.insert_before(before, node)
            self.dequantized[key] = nodes[-1].outputs[0]
        return self.dequantized[key]

    def _replace(self, old: ir.Node, nodes: list[ir.Node]) -> None:
        for node in nodes[:-1]:
            node.metadata_props.update(old.metadata_props)
            self.graph.insert_before(old, node)
        if not insert_replacement(self.graph, old, nodes[-1], old.outputs[0]):
            raise AssertionError(f"could not replace {old.op_type} node {old.name}")
        self.graph.remove(old, safe=True)


def _weight_name(value: ir.Value, reader: ir.Node) -> str:
    """The weight's parameter path: its initializer's name, or, for a weight the optimizer
    folded (a transposed copy), ``<module>.weight`` of the module reading it."""
    module = reader.metadata_props.get("pkg.dynexport.module")
    if value.name.endswith("weight") or not module:
        return value.name
    return f"{module}.weight"


def _is_vector(value: ir.Value | None, length: int) -> bool:
    return value is not None and value.shape is not None and list(value.shape) == [length]


def _attributes(values: dict) -> list[ir.Attr]:
    return [
        ir.AttrInt64(name, int(value)) if isinstance(value, (int, ir.DataType)) else ir.AttrFloat32(name, value)
        for name, value in values.items()
    ]


# -- storage forms: quantized weight -> arrays, and arrays -> float weight ----------------------


# Codes are turned into their stored bytes a chunk of rows (about 1 MB of codes) at a time.
_CONVERTED_PER_CHUNK = 1 << 20


def _row_chunks(n: int, k: int):
    rows = max(1, _CONVERTED_PER_CHUNK // k)
    return (slice(start, min(start + rows, n)) for start in range(0, n, rows))


def _pack_low_first(codes: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned ``bits``-wide codes along the last axis, packed into bytes low bits first."""
    codes = codes.astype(np.uint8, copy=False)
    if bits == 8:
        return codes
    if codes.shape[-1] % 2:
        codes = np.concatenate([codes, np.zeros((*codes.shape[:-1], 1), np.uint8)], axis=-1)
    # Each pair (low, high) read as the little-endian number low + 256 * high: shifted right by
    # 4 and or-ed with itself, its low byte is low + 16 * high.
    pairs = np.ascontiguousarray(codes).view("<u2")
    return (pairs | pairs >> 4).astype(np.uint8)


def _unpack_low_first(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    packed = packed.astype(np.uint8)
    if bits == 8:
        return packed[..., :count].astype(np.int32)
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    return codes[..., :count].astype(np.int32)


def _unsigned_codes(q: QuantizedWeight, rows: slice, padded_k: int) -> np.ndarray:
    """The codes of ``rows`` as onnxruntime's uint8 forms store them (symmetric ones shifted up
    by the default zero point ``2^(bits-1)``), K padded with the zero point."""
    values = q.values[rows].numpy()
    k = values.shape[1]
    codes = np.empty((len(values), padded_k), np.uint8)
    codes[:, :k] = values  # modulo 256: a negative code wraps, and the shift brings it back
    if q.zero_points is None:
        codes[:, :k] += np.uint8(2 ** (q.bits - 1))
        codes[:, k:] = 2 ** (q.bits - 1)
    else:
        codes[:, k:] = q.zero_points[rows, -1:].numpy()  # the padding lies in the last block
    return codes


def _float_array(tensor: torch.Tensor, dtype: ir.DataType) -> np.ndarray:
    return tensor.numpy().astype(dtype.numpy())


def _matmul_nbits_arrays(q: QuantizedWeight, dtype: ir.DataType) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """MatMulNBits' B ``[N, blocks, blob]``, scales ``[N * blocks]``, packed zero points."""
    n, blocks = q.scales.shape
    padded_k = blocks * q.block_size
    weight = np.empty((n, blocks, q.block_size * q.bits // 8), np.uint8)
    for rows in _row_chunks(n, padded_k):
        weight[rows] = _pack_low_first(_unsigned_codes(q, rows, padded_k).reshape(-1, blocks, q.block_size), q.bits)
    packed_zero_points = None if q.zero_points is None else _pack_low_first(q.zero_points.numpy(), q.bits).reshape(-1)
    return weight, _float_array(q.scales, dtype).reshape(-1), packed_zero_points


def _gather_block_quantized_arrays(q: QuantizedWeight, dtype: ir.DataType):
    """GatherBlockQuantized's table ``[V, H * bits / 8]``, scales ``[V, blocks]``, packed zero points."""
    v, h = q.values.shape
    table = np.empty((v, -(-h * q.bits // 8)), np.uint8)
    for rows in _row_chunks(v, h):
        table[rows] = _pack_low_first(_unsigned_codes(q, rows, h), q.bits)
    packed_zero_points = None if q.zero_points is None else _pack_low_first(q.zero_points.numpy(), q.bits)
    return table, _float_array(q.scales, dtype), packed_zero_points


def _dequantize_linear_arrays(q: QuantizedWeight, dtype: ir.DataType, blocked: bool, *, transposed: bool):
    """DequantizeLinear's weight, scales and zero points: ``[K, N]`` when ``transposed`` (a
    MatMul's right operand), else ``[N, K]`` (a table); blocked along K, or one scale per N."""
    integer = {(4, True): ml_dtypes.int4, (4, False): ml_dtypes.uint4, (8, True): np.int8, (8, False): np.uint8}[
        (q.bits, q.symmetric)
    ]
    # Below opset 19 DequantizeLinear's scales are float32 only.
    scale_dtype = dtype if blocked else ir.DataType.FLOAT
    scales, zero_points = q.scales.numpy(), None if q.zero_points is None else q.zero_points.numpy()
    if not blocked:
        scales, zero_points = scales[:, 0], None if zero_points is None else zero_points[:, 0]
    arrays = ((q.values.numpy(), integer), (scales, scale_dtype.numpy()), (zero_points, integer))
    # Transposed before the cast: numpy transposes int8 faster than ml_dtypes' int4.
    return tuple(
        None if array is None else np.ascontiguousarray(array.T if transposed else array).astype(array_dtype)
        for array, array_dtype in arrays
    )


def _matmul_nbits_weight(node: ir.Node) -> np.ndarray:
    """The float ``[N, K]`` a MatMulNBits node's packed inputs stand for."""
    k, n = _int_attribute(node, "K", 0), _int_attribute(node, "N", 0)
    bits, block_size = _int_attribute(node, "bits", 4), _int_attribute(node, "block_size", 0)
    packed = constant_array(node.inputs[1])
    blocks = packed.shape[1]
    codes = _unpack_low_first(packed, bits, block_size).reshape(n, blocks * block_size)
    zero_points = _optional_input(node, 3)
    if zero_points is None:
        zero_points = np.full((n, blocks), 2 ** (bits - 1), np.int32)
    else:
        zero_points = _unpack_low_first(constant_array(zero_points).reshape(n, -1), bits, blocks)
    scales = constant_array(node.inputs[2]).reshape(n, blocks).astype(np.float64)
    weight = (codes - np.repeat(zero_points, block_size, axis=1)) * np.repeat(scales, block_size, axis=1)
    return weight[:, :k]


def _gather_block_quantized_table(node: ir.Node) -> np.ndarray:
    bits, block_size = _int_attribute(node, "bits", 4), _int_attribute(node, "block_size", 0)
    scales = _reshaped_constant(node.inputs[2]).astype(np.float64)
    data = _reshaped_constant(node.inputs[0])
    h = data.shape[1] * 8 // bits
    codes = _unpack_low_first(data, bits, h)
    zero_points = _optional_input(node, 3)
    if zero_points is None:
        zero_points = np.full(scales.shape, 2 ** (bits - 1), np.int32)
    else:
        zero_points = _unpack_low_first(_reshaped_constant(zero_points), bits, scales.shape[1])
    expand = lambda per_block: np.repeat(per_block, block_size, axis=1)[:, :h]
    return (codes - expand(zero_points)) * expand(scales)


def _reshaped_constant(value: ir.Value) -> np.ndarray:
    """A constant, or a Reshape of one (a MatMulNBits weight read as a table)."""
    reshape = producer(value, "Reshape")
    if reshape is not None:
        return constant_array(reshape.inputs[0]).reshape(constant_array(reshape.inputs[1]))
    return constant_array(value)


def _dequantize_linear(node: ir.Node) -> np.ndarray:
    weight = constant_array(node.inputs[0]).astype(np.int32)
    scales = constant_array(node.inputs[1]).astype(np.float64)
    zero_points = _optional_input(node, 2)
    zero_points = (
        np.zeros(scales.shape, np.int32) if zero_points is None else constant_array(zero_points).astype(np.int32)
    )
    axis = _int_attribute(node, "axis", 1)
    block_size = _int_attribute(node, "block_size", 0)
    if block_size:
        expand = lambda per_block: np.repeat(per_block, block_size, axis=axis).take(
            range(weight.shape[axis]), axis=axis
        )
    else:
        shape = [1] * weight.ndim
        shape[axis] = -1
        expand = lambda per_index: per_index.reshape(shape)
    return (weight - expand(zero_points)) * expand(scales)


def _optional_input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if len(node.inputs) > index else None


def dequantized_model(model: ir.Model) -> ir.Model:
    """A copy of a quantized ``model`` computing in float with the weights its quantized
    initializers stand for, dequantized here in float64 from the stored bytes (read by this
    module's own unpacking, not onnxruntime's): ``MatMulNBits`` becomes ``MatMul`` (+ ``Add``
    of its bias), ``GatherBlockQuantized`` becomes ``Gather``, a ``DequantizeLinear`` of
    constants becomes the constant it computes. Running both models on the same inputs checks
    the stored forms against onnxruntime's kernels: they agree up to float rounding."""
    copy = model.clone()
    graph = copy.graph
    for node in list(graph):
        if node.domain == MS_DOMAIN and node.op_type == "MatMulNBits":
            weight = _matmul_nbits_weight(node)
            dtype = node.inputs[0].dtype
            transposed = add_initializer(graph, weight.T.astype(dtype.numpy()), f"{node.inputs[1].name}.dequantized")
            nodes = [ir.Node("", "MatMul", [node.inputs[0], transposed])]
            bias = _optional_input(node, 5)
            if bias is not None:
                nodes.append(ir.Node("", "Add", [nodes[0].outputs[0], bias]))
        elif node.domain == MS_DOMAIN and node.op_type == "GatherBlockQuantized":
            table = _gather_block_quantized_table(node)
            dtype = node.inputs[2].dtype
            table = add_initializer(graph, table.astype(dtype.numpy()), f"{node.inputs[0].name}.dequantized")
            nodes = [ir.Node("", "Gather", [table, node.inputs[1]], _attributes({"axis": 0}))]
        elif node.op_type == "DequantizeLinear" and all(
            v is None or constant_array(v) is not None for v in node.inputs
        ):
            dequantized = _dequantize_linear(node).astype(node.inputs[1].dtype.numpy())
            value = add_initializer(graph, dequantized, f"{node.inputs[0].name}.dequantized")
            node.outputs[0].replace_all_uses_with(value)
            graph.remove(node, safe=True)
            continue
        else:
            continue
        for extra in nodes[:-1]:
            graph.insert_before(node, extra)
        insert_replacement(graph, node, nodes[-1], node.outputs[0])
        graph.remove(node, safe=True)
    remove_dead_code(graph)
    if not any(node.domain == MS_DOMAIN for node in graph):
        copy.opset_imports.pop(MS_DOMAIN, None)
    del copy.metadata_props[QUANTIZATION_KEY]
    return copy
