"""The opsets the op tests and property specs run at: dynexport's default and 17, the opset most
deployments pin (TensorRT, OpenVINO, mobile and web runtimes). A test that names its own
``opset_version`` keeps it."""

import pytest

from tests.equivalence import TESTED_OPSET

LOW_OPSET = 17


@pytest.fixture(autouse=True, params=[None, LOW_OPSET], ids=["default-opset", f"opset{LOW_OPSET}"])
def tested_opset(request):
    token = TESTED_OPSET.set(request.param)
    yield request.param
    TESTED_OPSET.reset(token)
