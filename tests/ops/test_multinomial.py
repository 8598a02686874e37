"""torch.multinomial against onnxruntime: samples are random, so the tests check what every
sample must satisfy (shape, dtype, zero weights never drawn, no repeats without replacement) and
the frequencies of many draws."""

from __future__ import annotations

import onnx
import pytest
import torch

import dynexport

Dim = torch.export.Dim


def exported(fn, *args, **options):
    program = dynexport.export(fn, args, **options)
    onnx.checker.check_model(program.model_proto, full_check=True)
    return program


@pytest.mark.parametrize("replacement", [False, True])
def test_samples_avoid_zero_weights_at_a_dynamic_batch(replacement):
    def draw(weights):
        return torch.multinomial(weights, 3, replacement=replacement)

    weights = torch.tensor([[0.0, 1.0, 2.0, 0.0, 3.0, 1.0]]).repeat(2, 1)
    program = exported(draw, weights, dynamic_shapes=({0: Dim("batch")},))
    many = weights[:1].repeat(500, 1)
    samples = program(many)
    assert samples.shape == (500, 3) and samples.dtype == torch.int64
    assert not torch.isin(samples, torch.tensor([0, 3])).any()
    assert ((samples >= 0) & (samples < 6)).all()
    if not replacement:
        assert (samples.sort(dim=1).values.diff(dim=1) != 0).all()


def test_without_replacement_draws_every_category_once():
    program = exported(lambda w: torch.multinomial(w, 4), torch.tensor([1.0, 5.0, 0.5, 2.0]))
    assert program(torch.tensor([1.0, 5.0, 0.5, 2.0])).sort().values.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("replacement", [False, True])
def test_frequencies_follow_the_weights(replacement):
    # First draws: category 1 in 80% of rows. 20000 rows put the frequency within 0.03 of 0.8
    # except with a probability below 1e-20.
    weights = torch.tensor([1.0, 4.0, 0.0])
    program = exported(lambda w: torch.multinomial(w, 1, replacement=replacement), weights.repeat(2, 1),
                       dynamic_shapes=({0: Dim("batch")},))
    first = program(weights.repeat(20000, 1))[:, 0]
    assert abs(float((first == 1).float().mean()) - 0.8) < 0.03
    assert not (first == 2).any()


def test_second_draws_without_replacement_follow_the_remaining_weights():
    # Weights 1 and 4: the second draw is whichever the first did not take, so category 0 comes
    # second in 80% of rows (a draw with replacement would repeat category 1 in 64%).
    weights = torch.tensor([1.0, 4.0])
    program = exported(lambda w: torch.multinomial(w, 2), weights.repeat(2, 1), dynamic_shapes=({0: Dim("batch")},))
    second = program(weights.repeat(20000, 1))[:, 1]
    assert abs(float((second == 0).float().mean()) - 0.8) < 0.03
