"""Hypothesis profiles: "ci" (the default: derandomized, bounded examples, no example database)
and "deep" (many more examples, every op at every dtype), chosen with
DYNEXPORT_HYPOTHESIS_PROFILE=deep; "coverage" is what ``python -m tests.property.coverage`` runs.

The ``torchvision`` and ``timm`` fixtures import torchvision through tests/torchvision_ops.py.
Where torchvision is installed, its operators are defined before any test runs: transformers and
timm import torchvision as they load, which fails with the registry's CUDA build of torchvision
until they are.

Every test leaves torch's thread count as it found it (``torch_threads_restored``)."""

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

from tests.torchvision_ops import load_torchvision, load_torchvision_if_installed

_COMMON = dict(
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much, HealthCheck.differing_executors],
)
settings.register_profile("ci", max_examples=4, derandomize=True, **_COMMON)
settings.register_profile("deep", max_examples=50, **_COMMON)
settings.register_profile("coverage", max_examples=3, derandomize=True, phases=[Phase.explicit, Phase.generate], **_COMMON)
settings.load_profile(os.environ.get("DYNEXPORT_HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    load_torchvision_if_installed()


@pytest.fixture(autouse=True)
def torch_threads_restored():
    """torch's thread count as it was before each test: Ultralytics' device selection sets it to
    the cores less one (1 on CI's two), and eager PyTorch then computes some ops differently (a
    grouped ConvTranspose with an empty output refuses on one thread) for the rest of the worker."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def torchvision():
    """torchvision, its operators defined with CPU kernels in torch ops when its compiled library
    does not load (the registry's wheel is a CUDA build; see tests/torchvision_ops.py)."""
    return load_torchvision()


@pytest.fixture(scope="session")
def timm(torchvision):
    """timm, which imports torchvision as it loads."""
    import timm

    return timm
