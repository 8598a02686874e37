"""Every property test runs at dynexport's default opset and at the low one (17); the low opset's
half is marked slow, out of the default run (the op tests in tests/ops run at both by default)."""

from pathlib import Path

import pytest

from tests.opset_parametrization import LOW_OPSET, tested_opset  # noqa: F401  (autouse: every test at two opsets)


_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    # Called with the whole session's items, not only this directory's.
    for item in items:
        callspec = getattr(item, "callspec", None)
        if item.path.parent == _HERE and callspec is not None and callspec.params.get("tested_opset") == LOW_OPSET:
            item.add_marker(pytest.mark.slow)
