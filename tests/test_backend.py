"""The torch.compile backend: Dynamo subgraphs exported by the same pipeline, run in onnxruntime,
compared with eager PyTorch."""

from __future__ import annotations

import os
import warnings

import onnx
import onnxruntime as ort
import pytest
import torch

import dynexport
from tests.equivalence import assert_close


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, 4)
        self.register_buffer("temperature", torch.tensor(2.0))

    def forward(self, x):
        return torch.softmax(self.head(torch.relu(self.encoder(x))) / self.temperature, dim=-1)


class PrintBreak(torch.nn.Module):
    """A print() splits forward in two subgraphs."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(6, 6)
        self.second = torch.nn.Linear(6, 3)

    def forward(self, x):
        h = torch.tanh(self.first(x))
        print("between the layers")
        return self.second(h) * 2


class ItemBreak(torch.nn.Module):
    """``.item()`` on a data-dependent value ends a subgraph; the value drives the next one."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(5, 5)

    def forward(self, x):
        scale = x.abs().max().item()
        return self.proj(x / scale) + scale


def compiled(model, **options):
    onnx_backend = dynexport.backend(**options)
    return torch.compile(model, backend=onnx_backend), onnx_backend


def test_string_backend_is_registered_through_the_entry_point():
    assert "dynexport" in torch._dynamo.list_backends()
    torch.manual_seed(0)
    model = Classifier().eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert_close(torch.compile(model, backend="dynexport")(x), model(x))


def test_model_without_graph_break_is_one_onnx_subgraph():
    torch.manual_seed(0)
    model = Classifier().eval()
    fn, onnx_backend = compiled(model)
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert_close(fn(x), model(x))
    (subgraph,) = onnx_backend.subgraphs
    assert subgraph.fallback_reason is None and subgraph.sessions_built == 1
    # Weights are initializers named by their path in the model; the one input is x.
    graph = subgraph.program.model.graph
    assert set(graph.initializers) >= {"encoder.weight", "head.bias"}
    assert [v.name for v in graph.inputs] == ["x"]


@pytest.mark.parametrize("model_class", [PrintBreak, ItemBreak])
def test_graph_breaks_give_several_onnx_subgraphs(model_class, capsys):
    torch.manual_seed(0)
    model = model_class().eval()
    fn, onnx_backend = compiled(model)
    x = torch.randn(4, model.first.in_features if model_class is PrintBreak else 5)
    with torch.no_grad():
        assert_close(fn(x), model(x))
        other = torch.randn_like(x) * 3
        assert_close(fn(other), model(other))
    assert len(onnx_backend.subgraphs) >= 2
    assert all(s.fallback_reason is None and s.program is not None for s in onnx_backend.subgraphs)


def test_dynamic_batch_reuses_one_session():
    torch.manual_seed(0)
    model = Classifier().eval()
    onnx_backend = dynexport.backend()
    fn = torch.compile(model, backend=onnx_backend, dynamic=True)
    with torch.no_grad():
        for batch in (2, 3, 7, 16):
            x = torch.randn(batch, 8)
            assert_close(fn(x), model(x))
    (subgraph,) = onnx_backend.subgraphs
    assert subgraph.sessions_built == 1
    (x_input,) = subgraph.program.model.graph.inputs
    assert isinstance(x_input.shape[0].value, str) and x_input.shape[1] == 8


class NormalizedConv(torch.nn.Module):
    """BatchNorm and ReLU6 read float attributes (eps, momentum, the clamp bounds), which Dynamo
    passes as 0-d tensors under dynamic=True; batch_norm checks ``eps < 0`` on its value."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.relu6 = torch.nn.ReLU6()

    def forward(self, x):
        return self.relu6(self.bn(self.conv(x)))


def test_float_attributes_of_the_model_are_constants_of_its_session():
    torch.manual_seed(0)
    model = NormalizedConv().eval()
    model.bn.running_var.uniform_(0.01, 0.1)  # where eps shows
    onnx_backend = dynexport.backend(fallback="raise")
    fn = torch.compile(model, backend=onnx_backend, dynamic=True)
    with torch.no_grad():
        for batch in (2, 5):
            x = torch.randn(batch, 3, 8, 8)
            assert_close(fn(x), model(x))
        (subgraph,) = onnx_backend.subgraphs
        assert subgraph.sessions_built == 1
        model.bn.eps = 0.5  # Dynamo does not guard on it: the subgraph builds a session for it
        assert_close(fn(x), model(x))
        assert subgraph.sessions_built == 2


def test_a_float_argument_is_an_input_of_one_session():
    onnx_backend = dynexport.backend(fallback="raise")
    fn = torch.compile(lambda x, s: x * s + 1, backend=onnx_backend, dynamic=True)
    x = torch.randn(3)
    for s in (2.5, -0.5, 4.0):
        assert_close(fn(x, s), x * s + 1)
    assert [subgraph.sessions_built for subgraph in onnx_backend.subgraphs] == [1]


def test_automatic_dynamic_builds_a_symbolic_session_once():
    """Dynamo specialises the first batch size, makes the dim dynamic on the second: two sessions,
    then none for further sizes."""
    torch.manual_seed(0)
    model = Classifier().eval()
    fn, onnx_backend = compiled(model)
    with torch.no_grad():
        for batch in (2, 3, 5, 9):
            x = torch.randn(batch, 8)
            assert_close(fn(x), model(x))
    assert sum(s.sessions_built for s in onnx_backend.subgraphs) == 2


class MixedDtypes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(10, 4)

    def forward(self, ids, mask, weights):
        hidden = self.embedding(ids) * mask.unsqueeze(-1)
        total = (hidden.double() * weights.unsqueeze(-1)).sum(1)
        return total, ids.argmax(-1), mask.any(-1), total.to(torch.float16)


def test_mixed_dtypes_cross_in_and_out():
    torch.manual_seed(0)
    model = MixedDtypes().eval()
    fn, _ = compiled(model)
    args = (torch.randint(0, 10, (3, 5)), torch.rand(3, 5) > 0.3, torch.rand(3, 5, dtype=torch.float64))
    with torch.no_grad():
        actual, expected = fn(*args), model(*args)
    assert [t.dtype for t in actual] == [torch.float64, torch.int64, torch.bool, torch.float16]
    assert_close(actual, expected)


@torch.library.custom_op("dynexport_backend_test::blend", mutates_args=())
def blend(x: torch.Tensor) -> torch.Tensor:
    return x.sin() + x.cos()


@blend.register_fake
def _(x):
    return torch.empty_like(x)


class WithUnsupportedOp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return blend(self.linear(x)) * 2


def test_unsupported_op_falls_back_to_eager_with_a_warning():
    torch.manual_seed(0)
    model = WithUnsupportedOp().eval()
    fn, onnx_backend = compiled(model)
    x = torch.randn(2, 4)
    with torch.no_grad(), pytest.warns(UserWarning, match=r"(?s)runs eagerly in PyTorch.*dynexport_backend_test.blend"):
        assert_close(fn(x), model(x))
    (subgraph,) = onnx_backend.subgraphs
    assert "UnsupportedOperatorError" in subgraph.fallback_reason and subgraph.program is None
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, not on every call
        assert_close(fn(x + 1), model(x + 1))


def test_unsupported_op_raises_with_fallback_raise():
    fn, _ = compiled(WithUnsupportedOp().eval(), fallback="raise")
    with torch.no_grad(), pytest.raises(dynexport.errors.UnsupportedOperatorError, match="blend"):
        fn(torch.randn(2, 4))


@pytest.mark.parametrize("norm_first, activation", [(False, "relu"), (True, "gelu")])
def test_the_transformer_encoder_fast_path_runs_in_onnxruntime(norm_first, activation):
    # Under no_grad in eval mode nn.TransformerEncoderLayer calls one fused kernel.
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, norm_first=norm_first, activation=activation)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    fn, onnx_backend = compiled(model, fallback="raise")
    with torch.no_grad():
        for batch, steps in [(2, 5), (3, 7), (1, 2)]:
            x = torch.randn(batch, steps, 16)
            assert_close(fn(x), model(x))
    programs = [subgraph.program for subgraph in onnx_backend.subgraphs]
    assert programs and all(program is not None for program in programs)


_STEPS = 4
_CAUSAL = torch.triu(torch.ones(_STEPS, _STEPS, dtype=torch.bool), 1)
_PADDING = torch.tensor([[False, False, False, True], [False, False, True, True]])


@pytest.mark.parametrize(
    "masks",
    [
        dict(src_mask=torch.nn.Transformer.generate_square_subsequent_mask(_STEPS)),
        dict(src_mask=_CAUSAL),
        dict(src_key_padding_mask=_PADDING),
        dict(src_mask=_CAUSAL, src_key_padding_mask=_PADDING),
    ],
    ids=["float causal", "bool causal", "key padding", "both"],
)
def test_the_transformer_encoder_fast_path_with_masks(masks):
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
    fn, _ = compiled(model, fallback="raise")
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, _STEPS, 8)
            assert_close(fn(x, **masks), model(x, **masks))


def test_autograd_runs_eagerly_with_one_warning_and_exact_gradients():
    torch.manual_seed(0)
    model = Classifier()
    fn, onnx_backend = compiled(model)
    x = torch.randn(3, 8)
    with pytest.warns(UserWarning, match="autograd is recording") as record:
        fn(x).sum().backward()
        fn(x).sum().backward()
    assert len([w for w in record if "autograd" in str(w.message)]) == 1
    compiled_grad = model.encoder.weight.grad.clone()
    model.zero_grad()
    model(x).sum().backward()
    model(x).sum().backward()
    assert_close(compiled_grad, model.encoder.weight.grad)
    assert all(s.sessions_built == 0 for s in onnx_backend.subgraphs)
    with torch.no_grad():  # the same compiled model runs in onnxruntime without autograd
        assert_close(fn(x), model(x))
    assert sum(s.sessions_built for s in onnx_backend.subgraphs) == 1


def test_weights_updated_in_place_rebuild_the_session():
    torch.manual_seed(0)
    model = Classifier().eval()
    fn, onnx_backend = compiled(model)
    x = torch.randn(3, 8)
    with torch.no_grad():
        fn(x)
        model.encoder.weight.mul_(-1)
        assert_close(fn(x), model(x))
    assert onnx_backend.subgraphs[0].sessions_built == 2


class Tagged(torch.nn.Module):
    """Dynamo guards on ``tag`` (a branch) and ``scale`` (a constant of the graph); both branches
    compute the same graph."""

    def __init__(self, scale: float = 2.0):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)
        self.tag = "a"
        self.scale = scale

    def forward(self, x):
        if self.tag == "a":
            y = self.proj(x)
        else:
            y = self.proj(x)
        return torch.relu(y) * self.scale


def test_a_recompile_to_the_same_graph_reuses_its_subgraph_and_session():
    torch.manual_seed(0)
    model = Tagged().eval()
    fn, onnx_backend = compiled(model, fallback="raise")
    x = torch.randn(2, 4)
    with torch.no_grad():
        fn(x)
        model.tag = "b"  # a guard fails: Dynamo compiles the frame again, to the same graph
        assert_close(fn(x), model(x))
    (subgraph,) = onnx_backend.subgraphs
    assert subgraph.sessions_built == 1


def test_a_recompile_to_another_constant_or_other_weights_gets_its_own_subgraph():
    torch.manual_seed(0)
    model, twin = Tagged().eval(), Tagged().eval()
    onnx_backend = dynexport.backend(fallback="raise")
    fn, twin_fn = torch.compile(model, backend=onnx_backend), torch.compile(twin, backend=onnx_backend)
    x = torch.randn(2, 4)
    with torch.no_grad():
        fn(x)
        twin.tag = "b"  # the same code on the twin's weights
        assert_close(twin_fn(x), twin(x))
        model.scale = 3.0  # the same weights in other code
        assert_close(fn(x), model(x))
    assert [s.sessions_built for s in onnx_backend.subgraphs] == [1, 1, 1]


def test_save_dir_writes_each_subgraph_stably_and_the_files_match(tmp_path):
    torch.manual_seed(0)
    model = PrintBreak().eval()
    x = torch.randn(2, 6)
    fn, onnx_backend = compiled(model, save_dir=tmp_path / "onnx")
    with torch.no_grad():
        expected = model(x)
        assert_close(fn(x), expected)
    files = sorted(os.listdir(tmp_path / "onnx"))
    assert files == sorted(f"{s.name}.onnx" for s in onnx_backend.subgraphs) and len(files) == 2

    # The files chain like the subgraphs: the first takes x, the second the first's output.
    first, second = (onnx_backend.subgraphs[0].name + ".onnx", onnx_backend.subgraphs[1].name + ".onnx")
    value = x
    for name in (first, second):
        onnx.checker.check_model(str(tmp_path / "onnx" / name), full_check=True)
        session = ort.InferenceSession(str(tmp_path / "onnx" / name), providers=["CPUExecutionProvider"])
        (feed,) = session.get_inputs()
        value = torch.from_numpy(session.run(None, {feed.name: value.numpy()})[0])
    assert_close(value, expected)

    torch._dynamo.reset()
    fn_again, _ = compiled(model, save_dir=tmp_path / "again")
    with torch.no_grad():
        fn_again(x)
    assert sorted(os.listdir(tmp_path / "again")) == files


def test_symint_inputs_become_shape_reads_and_free_ints_inputs():
    def reshape_by(x, n):
        return x.reshape(x.shape[0] * n, -1) + n, x.shape[0] > 2

    onnx_backend = dynexport.backend()
    fn = torch.compile(reshape_by, backend=onnx_backend, dynamic=True)
    for batch, n in ((2, 2), (4, 3), (3, 5)):
        x = torch.randn(batch, 6 * n)
        (actual, is_long), (expected, expected_is_long) = fn(x, n), reshape_by(x, n)
        assert_close(actual, expected)
        assert is_long is expected_is_long  # a symbolic bool comes back as a Python bool
    assert sum(s.sessions_built for s in onnx_backend.subgraphs) == 1


@pytest.mark.parametrize(
    "options, error",
    [
        (dict(fallback="never"), "fallback='never'"),
        (dict(opset_version=9), "opset_version=9"),
        (dict(providers="CPUExecutionProvider"), "providers must be a list"),
        (dict(session_options={"threads": 1}), "session_options must be"),
    ],
)
def test_bad_options_are_rejected_when_the_backend_is_made(options, error):
    with pytest.raises((ValueError, TypeError), match=error):
        dynexport.backend(**options)


def test_providers_and_session_options_reach_the_session():
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    model = Classifier().eval()
    fn, onnx_backend = compiled(model, providers=["CPUExecutionProvider"], session_options=options, opset_version=18)
    x = torch.randn(2, 8)
    with torch.no_grad():
        assert_close(fn(x), model(x))
    (subgraph,) = onnx_backend.subgraphs
    assert subgraph.program.model.opset_imports[""] == 18
