"""Spectral operators and complex tensors (stft, the fft family, complex arithmetic and views)
against onnxruntime, with dynamic signal lengths checked at another length."""

from __future__ import annotations

import pytest
import torch

import dynexport
from dynexport.errors import ComplexTensorError, OpsetTooLowError, TranslationError, UnsupportedOperatorError
from dynexport.options import DEFAULT_OPSET
from tests.equivalence import assert_exports_equivalent, op_histogram

DFT_OPSET = 17  # ONNX has DFT and STFT from opset 17
LENGTH = torch.export.Dim("length", min=500, max=4096)
# A float32 FFT's rounding error scales with the whole spectrum's magnitude (about sqrt(n) for
# these unit-variance signals), not with each bin's: two correct results differ by 1e-5 in bins
# near 0. 1e-4 is a few float32 roundings of a 1000-point spectrum.
SPECTRUM_ATOL = 1e-4


@pytest.fixture(autouse=True)
def ffts_from_opset_17(tested_opset):
    # Only a DYNEXPORT_TEST_LOW_OPSET run tests below 17; test_ffts_are_refused_below_opset_17
    # checks the refusal there in every run.
    if (tested_opset or DEFAULT_OPSET) < DFT_OPSET:
        pytest.skip(f"the FFT operators need opset {DFT_OPSET}")
BATCH = torch.export.Dim("batch", min=2)


class Lambda(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _length_dynamic(fn, x, longer, *, atol=SPECTRUM_ATOL, **options):
    """Export ``fn(x)`` with the signal's last dim dynamic, and check it at ``longer`` too."""
    dims = {x.dim() - 1: LENGTH}
    return assert_exports_equivalent(
        Lambda(fn), (x,), dynamic_shapes=(dims,), resized=[(longer,)], atol=atol, **options
    )


# -- stft --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "center, normalized, onesided",
    [(True, False, True), (False, True, False), (True, True, None)],
    ids=["centered", "uncentered-normalized-twosided", "centered-normalized"],
)
def test_stft_magnitude_with_hann_window_at_another_length(center, normalized, onesided):
    # n_fft 400, not a power of 2 (Whisper's): onnxruntime's DFT is exact enough there only in float64.
    def spectrogram(x):
        window = torch.hann_window(400)
        spectrum = torch.stft(x, 400, 160, window=window, center=center, normalized=normalized,
                              onesided=onesided, return_complex=True)
        return spectrum.abs()

    program = _length_dynamic(spectrogram, torch.randn(2, 1600), torch.randn(2, 2345))
    assert op_histogram(program)["STFT"] == 1


def test_stft_power_of_a_1d_signal_with_a_shorter_window():
    # win_length < n_fft: PyTorch zero-pads the window about the middle.
    def power(x):
        spectrum = torch.stft(x, 64, 16, win_length=48, window=torch.hann_window(48), return_complex=True)
        return spectrum.abs().pow(2), torch.view_as_real(spectrum)

    _length_dynamic(power, torch.randn(700), torch.randn(901))


class MelSpectrogram(torch.nn.Module):
    """torchaudio's MelSpectrogram in outline: stft, power, a mel filterbank, log."""

    def __init__(self, n_fft=256, hop=64, n_mels=20):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft))
        self.register_buffer("filterbank", torch.rand(n_fft // 2 + 1, n_mels))

    def forward(self, waveform):
        spectrum = torch.stft(waveform, self.n_fft, self.hop, window=self.window, return_complex=True)
        power = spectrum.abs().pow(2)
        mel = torch.matmul(power.transpose(-1, -2), self.filterbank).transpose(-1, -2)
        return torch.log(mel.clamp(min=1e-10))


def test_mel_spectrogram_with_dynamic_batch_and_length():
    model = MelSpectrogram().eval()
    assert_exports_equivalent(
        model, (torch.randn(2, 1000),), dynamic_shapes=({0: BATCH, 1: LENGTH},), resized=[(torch.randn(3, 1777),)],
        atol=SPECTRUM_ATOL,
    )


def test_istft_of_a_filtered_stft_at_another_length():
    # istft decomposes (an inverse FFT per frame, overlap-add); it reads the spectrum's sizes.
    def filtered(x):
        window = torch.hann_window(64)
        spectrum = torch.stft(x, 64, 16, window=window, return_complex=True)
        return torch.istft(spectrum * torch.linspace(1.0, 0.2, 33).unsqueeze(-1), 64, 16, window=window)

    _length_dynamic(filtered, torch.randn(2, 600), torch.randn(2, 1000))


class WhisperLogMel(torch.nn.Module):
    """openai-whisper's log_mel_spectrogram (n_fft 400, hop 160), with a random filterbank."""

    def __init__(self, n_mels=16):
        super().__init__()
        self.register_buffer("filters", torch.rand(n_mels, 201))

    def forward(self, audio):
        stft = torch.stft(audio, 400, 160, window=torch.hann_window(400), return_complex=True)
        magnitudes = stft[..., :-1].abs() ** 2
        log_spec = torch.clamp(self.filters @ magnitudes, min=1e-10).log10()
        log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
        return (log_spec + 4.0) / 4.0


def test_whisper_log_mel_at_another_length():
    assert_exports_equivalent(
        WhisperLogMel(), (torch.randn(3200),), dynamic_shapes=({0: LENGTH},), resized=[(torch.randn(4001),)],
        atol=SPECTRUM_ATOL,
    )


# -- the fft family ----------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
def test_rfft_irfft_and_fft_ifft_in_each_norm_at_another_length(norm):
    def transforms(x):
        spectrum = torch.fft.rfft(x, norm=norm)
        full = torch.fft.fft(x, norm=norm)
        back = torch.fft.irfft(spectrum * 0.5, n=x.shape[-1], norm=norm)
        return spectrum.abs(), torch.view_as_real(spectrum), full.real, full.imag, back, torch.fft.ifft(full, norm=norm).real

    # irfft's n = x.shape[-1] makes torch.export require an even length.
    _length_dynamic(transforms, torch.randn(2, 600), torch.randn(2, 1002))


@pytest.mark.parametrize("n", [64, 65])
def test_irfft_of_a_filtered_spectrum_of_even_and_odd_length(n):
    def lowpass(x):
        spectrum = torch.fft.rfft(x)
        return torch.fft.irfft(spectrum * torch.linspace(1.0, 0.0, spectrum.shape[-1]), n=n)

    assert_exports_equivalent(Lambda(lowpass), (torch.randn(3, n),))


def test_fnet_mixing_fft2_real_with_dynamic_sequence():
    def fnet(x):
        return torch.fft.fft2(x).real, torch.fft.fft(torch.fft.fft(x, dim=-1), dim=-2).imag

    program = assert_exports_equivalent(
        Lambda(fnet), (torch.randn(2, 16, 12),), dynamic_shapes=({1: torch.export.Dim("seq", min=2)},),
        resized=[(torch.randn(2, 23, 12),)], atol=SPECTRUM_ATOL,
    )
    assert op_histogram(program)["DFT"] == 4  # two per 2-D transform


class Projected(torch.nn.Module):
    """``fn`` of a linear projection: the transform's input is computed, not a graph input."""

    def __init__(self, fn, width: int):
        super().__init__()
        self.fn, self.project = fn, torch.nn.Linear(width, width)

    def forward(self, x):
        return self.fn(self.project(x))


def _sizes_dynamic(fn, *shapes, atol=SPECTRUM_ATOL):
    """Export ``fn`` of a projection of a (batch, rows, columns) signal of ``shapes[0]`` with
    the batch and rows dynamic, and check it at the other shapes."""
    torch.manual_seed(0)
    x, *others = [torch.randn(*shape) for shape in shapes]
    dims = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("rows", min=2)},)
    program = assert_exports_equivalent(
        Projected(fn, x.shape[-1]).eval(), (x,), dynamic_shapes=dims, resized=[(y,) for y in others], atol=atol
    )
    assert [str(d) for d in program.model.graph.inputs[0].shape][:2] == ["batch", "rows"]
    return program


def test_ffts_of_a_computed_signal_keep_its_dynamic_sizes():
    """torch's own decompositions of the fft functions read sizes as ints: every dynamic dim of the
    program became its example's size, the batch too (FNet's fftn exported as [2, 16])."""

    def transforms(x):
        spectrum = torch.fft.fftn(x, dim=(1, 2))
        halves = torch.fft.rfft2(x, norm="ortho")
        return (
            spectrum.real, torch.fft.ifftn(spectrum, dim=(1, 2)).real, torch.fft.irfft2(halves, s=x.shape[-2:], norm="ortho"),
            torch.fft.ifft(torch.fft.fft(x, dim=1), dim=1).imag, torch.fft.rfftn(x, dim=(1,)).abs(),
            torch.fft.irfftn(halves, dim=(-2, -1)),
        )

    _sizes_dynamic(transforms, (2, 16, 12), (3, 9, 12), (1, 2, 12))


@pytest.mark.parametrize("length, others", [(5, [(3, 9, 6), (1, 31, 6)]), (20, [(3, 14, 6), (1, 19, 6)])], ids=["cut", "padded"])
def test_lengths_given_cut_or_pad_dynamic_sizes(length, others):
    """``n``/``s`` resize the signal: cut where it is longer, zero-padded where shorter. torch's
    capture compares the length with ``n`` (its kernel runs while tracing the model), so the rows
    are refined to the example's side of it; the decompositions keep them dynamic there."""

    def transforms(x):
        return (
            torch.fft.fft(x, n=length, dim=1).real, torch.fft.rfft(x, n=length, dim=1).imag,
            torch.fft.fftn(x, s=(length, 7), dim=(1, 2)).abs(), torch.fft.irfft(torch.fft.rfft(x, dim=1), n=length, dim=1),
            torch.fft.hfft(torch.fft.ifft(x, dim=1), n=length, dim=1), torch.fft.ihfft(x, n=length, dim=1).real,
            torch.fft.ifft(x.to(torch.complex64) * 1j, n=length, dim=1).imag,
        )

    with pytest.warns(UserWarning, match="rows: m"):
        _sizes_dynamic(transforms, (2, 12, 6), *others)


def test_a_decomposition_that_fixes_dynamic_sizes_is_refused(monkeypatch):
    """A decomposition that reads a dynamic size as an int would make the program static without
    a word; the export is refused naming the operator, the dims and the model line."""
    from dynexport.decompositions import spectral

    def reads_sizes(x, s=None, dim=None, norm=None):
        return spectral.fftn(x[: int(x.shape[0])], s, dim, norm)

    monkeypatch.setitem(spectral.SPECTRAL_DECOMPOSITIONS, torch.ops.aten.fft_fftn.default, reads_sizes)
    dims = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("rows", min=2)},)
    with pytest.raises(TranslationError, match=r"aten.fft_fftn.default.*fixes sizes.*batch = 2") as caught:
        dynexport.export(Projected(lambda x: torch.fft.fftn(x, dim=(1, 2)).real, 8), (torch.randn(2, 5, 8),), dynamic_shapes=dims)
    assert "test_spectral.py" in caught.value.source and "None in dynamic_shapes" in str(caught.value)


def test_2d_real_transforms_and_float64():
    def transforms(x):
        return torch.fft.irfft2(torch.fft.rfft2(x, norm="ortho"), s=x.shape[-2:], norm="ortho"), torch.fft.rfft(x, n=20).abs()

    assert_exports_equivalent(Lambda(transforms), (torch.randn(2, 6, 10),))
    assert_exports_equivalent(Lambda(transforms), (torch.randn(2, 6, 10, dtype=torch.float64),))


def test_angle_of_a_spectrum_is_pi_not_minus_pi_at_the_real_bins():
    # Bins 0 and n/2 of a real signal's DFT are real: PyTorch's angle there is 0 or pi exactly.
    assert_exports_equivalent(Lambda(lambda x: torch.fft.rfft(x).angle()), (torch.randn(4, 64),))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_angle_of_real_numbers(dtype):
    x = torch.tensor([-2.0, -0.0, 0.0, 3.0, float("nan"), -float("inf")])
    x = x.nan_to_num(0.0, 0.0, -5.0).to(dtype) if dtype == torch.int64 else x
    assert_exports_equivalent(Lambda(torch.angle), (x,))


# -- complex arithmetic and views ----------------------------------------------------------------


class ComplexArithmetic(torch.nn.Module):
    def forward(self, x, pairs):
        a, b = torch.fft.rfft(x), torch.view_as_complex(pairs)
        cross = a * b.conj() + 2 * a - b / 4 - 1.5 + (0.5 - 2j) * a + 1j
        scaled = (a * x[..., :33]).transpose(0, 1)
        return (
            torch.view_as_real(cross),
            scaled.real,
            torch.cat([a, b], dim=-1).reshape(2, 3, -1).abs(),
            a.permute(1, 0)[5].imag,
            a[:, 1:7].unsqueeze(0).squeeze(1).squeeze(0).angle(),
            torch.view_as_real(x.to(torch.complex64) - a[..., :1]),
            torch.fft.fftshift(a, dim=-1).flip(0).abs(),
            torch.view_as_real(torch.roll(a, (3, 1), (-1, 0))),
        )


def test_complex_arithmetic_conjugates_and_views():
    assert_exports_equivalent(ComplexArithmetic(), (torch.randn(2, 64), torch.randn(2, 33, 2)))


class PhasesReductionsFactories(torch.nn.Module):
    def forward(self, x):
        a = torch.fft.rfft(x)
        rotated = torch.exp(1j * x[..., :33]) * a
        filled = torch.zeros(33, dtype=torch.complex64) + torch.ones_like(a) + torch.full((33,), 2 + 1j)
        filled = filled + torch.zeros_like(x, dtype=torch.complex64)[..., :33] + torch.full_like(a, 3.0)
        return (
            torch.view_as_real(rotated.sum(0)),
            torch.view_as_real(rotated.mean(-1, keepdim=True)),
            torch.view_as_real(a.mean()),
            torch.view_as_real(a * filled),
        )


def test_phase_rotations_reductions_and_factories():
    # Static: torch.export's decomposition of a real tensor times 1j fixes the batch (Eq(33*s0, 66)).
    assert_exports_equivalent(PhasesReductionsFactories(), (torch.randn(3, 64),), atol=SPECTRUM_ATOL)


class ComplexWeights(torch.nn.Module):
    """A complex buffer, and a complex constant folded from real buffers at export."""

    def __init__(self):
        super().__init__()
        self.register_buffer("response", torch.randn(33, dtype=torch.complex64))
        self.register_buffer("magnitude", torch.rand(33))
        self.register_buffer("phase", torch.rand(33))

    def forward(self, x):
        spectrum = torch.fft.rfft(x)
        return (spectrum * self.response).abs(), torch.view_as_real(spectrum * torch.polar(self.magnitude, self.phase))


def test_complex_weights_are_stored_as_pairs():
    assert_exports_equivalent(ComplexWeights(), (torch.randn(2, 64),))


def test_a_custom_rule_receives_and_returns_complex_values_as_pairs():
    def magnitude(ctx, x):
        squares = ctx.op.ReduceSum(ctx.op.Mul(x, x), ctx.op.Constant(value_ints=[-1]), keepdims=0)
        return ctx.op.Sqrt(squares)

    def scaled(ctx, x, factor):
        return ctx.op.Mul(x, ctx.op.Constant(value_float=float(factor)))

    assert_exports_equivalent(
        Lambda(lambda x: (torch.fft.rfft(x) * 3).abs()), (torch.randn(2, 64),),
        custom_translation_table={torch.ops.aten.abs.default: magnitude, torch.ops.aten.mul.Tensor: scaled},
    )


# -- refusals ------------------------------------------------------------------------------------


def test_complex_output_is_refused_with_the_fix():
    with pytest.raises(ComplexTensorError, match=r"output 'output' is a complex tensor .*view_as_real"):
        dynexport.export(Lambda(torch.fft.rfft), (torch.randn(2, 8),))


def test_complex_input_is_refused_with_the_fix():
    with pytest.raises(ComplexTensorError, match=r"input 'x' is a complex tensor .*view_as_complex"):
        dynexport.export(Lambda(torch.abs), (torch.randn(2, 8, dtype=torch.complex64),))


def test_an_operator_without_a_complex_rule_is_refused_not_run_on_the_pairs():
    with pytest.raises(UnsupportedOperatorError, match="sqrt.default .*on a complex tensor, which no rule for it handles"):
        dynexport.export(Lambda(lambda x: torch.fft.rfft(x).sqrt().abs()), (torch.randn(2, 8),))


def test_an_operator_on_a_complex_tensor_is_refused_even_with_the_custom_domain_fallback():
    # A custom-domain node would be fed the (real, imaginary) pairs, not a complex tensor.
    with pytest.raises(UnsupportedOperatorError, match="on a complex tensor"):
        dynexport.export(Lambda(lambda x: torch.fft.rfft(x).sqrt().abs()), (torch.randn(2, 8),), fallback="custom_domain")


def test_ffts_are_refused_below_opset_17():
    with pytest.raises(OpsetTooLowError) as raised:
        dynexport.export(Lambda(lambda x: torch.fft.rfft(x).abs()), (torch.randn(2, 8),), opset_version=DFT_OPSET - 1)
    assert [(use.target, use.min_opset) for use in raised.value.uses] == [("aten._fft_r2c.default", DFT_OPSET)]
    assert "opset_version=17" in str(raised.value)
