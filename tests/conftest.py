"""Hypothesis profiles: "ci" (the default: derandomized, bounded examples, no example database)
and "deep" (many more examples, every op at every dtype), chosen with
DYNEXPORT_HYPOTHESIS_PROFILE=deep; "coverage" is what ``python -m tests.property.coverage`` runs."""

import os

from hypothesis import HealthCheck, Phase, settings

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
