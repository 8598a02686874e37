from tests.opset_parametrization import tested_opset  # noqa: F401  (autouse: every test at two opsets)
