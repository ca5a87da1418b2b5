"""scheme_from_dict(s.describe()) == s for every sampling scheme, through JSON; malformed
descriptions are refused with an InvalidParameterError naming the key."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmf.errors import InvalidParameterError
from dpmf.sampling import (
    SCHEMES,
    BallsInBinsSampling,
    CyclicPoissonSampling,
    FixedOrderSampling,
    MinSepSampling,
    MultiAttributionMinSepSampling,
    PoissonSampling,
    scheme_from_dict,
)


def _json(d: dict) -> dict:
    return json.loads(json.dumps(d))


ALL = [
    PoissonSampling(0.1, 20),
    PoissonSampling(1.0, 1),
    FixedOrderSampling(2, 20),
    CyclicPoissonSampling(0.3, 20, 4),
    CyclicPoissonSampling(0.3, 20, 4, partition="independent"),
    MinSepSampling(0.05, 30, 5),
    MinSepSampling(0.05, 30, 5, warm_start=True),
    MinSepSampling(0.05, 30, 5, max_batch_size=12, dataset_size=500),
    MinSepSampling(1.0, 30, 5, warm_start=True, max_batch_size=100),
    MinSepSampling.from_participation_rate(0.01, 30, 7),
    BallsInBinsSampling(3, 30),
    MultiAttributionMinSepSampling(0.1, 20, 3, 2),
    MultiAttributionMinSepSampling(0.1, 20, 3, 2, warmup_steps=7),
]


@pytest.mark.parametrize("scheme", ALL, ids=[repr(s) for s in ALL])
def test_round_trip_every_scheme(scheme):
    back = scheme_from_dict(_json(scheme.describe()))
    assert type(back) is type(scheme)
    assert back == scheme
    assert back.describe() == scheme.describe()


def test_every_scheme_class_is_covered():
    assert {type(s) for s in ALL} == set(SCHEMES)


@settings(max_examples=50, deadline=None)
@given(
    p=st.floats(min_value=1e-12, max_value=1.0, allow_nan=False),
    steps=st.integers(1, 10_000),
    b=st.integers(1, 50),
    warm=st.booleans(),
)
def test_floats_round_trip_exactly(p, steps, b, warm):
    b = min(b, steps)  # a separation longer than the run is legal but warns (did you swap them?)
    for s in (PoissonSampling(p, steps), CyclicPoissonSampling(p, steps, b), MinSepSampling(p, steps, b, warm)):
        assert scheme_from_dict(json.loads(json.dumps(s.describe()))) == s


def test_fields_with_defaults_may_be_missing():
    assert scheme_from_dict({"name": "b-min-sep", "sampling_prob": 0.1, "steps": 10, "min_sep": 2}) == MinSepSampling(
        0.1, 10, 2
    )
    assert scheme_from_dict(
        {"name": "cyclic-poisson", "sampling_prob": 0.1, "steps": 10, "cycle_length": 2}
    ) == CyclicPoissonSampling(0.1, 10, 2)
    assert scheme_from_dict(
        {"name": "multi-attribution-b-min-sep", "sampling_prob": 0.1, "steps": 10, "min_sep": 2, "max_user_examples": 3}
    ) == MultiAttributionMinSepSampling(0.1, 10, 2, 3)


POISSON = {"name": "poisson", "sampling_prob": 0.1, "steps": 10}
MINSEP = MinSepSampling(0.05, 30, 5, max_batch_size=12, dataset_size=500).describe()
BAD = [
    ({"sampling_prob": 0.1, "steps": 10}, "key 'name' is missing"),
    ({"name": "uniform", "steps": 10}, "key 'name' must be one of"),
    ({"name": ["poisson"], "steps": 10}, "key 'name' must be one of"),
    ({"name": "poisson", "steps": 10}, "key 'sampling_prob' is missing"),
    (dict(POISSON, steps="10"), "key 'steps' must be an integer"),
    (dict(POISSON, steps=10.0), "key 'steps' must be an integer"),
    (dict(POISSON, steps=True), "key 'steps' must be an integer"),
    (dict(POISSON, steps=0), "steps must be an integer >= 1"),
    (dict(POISSON, sampling_prob=None), "key 'sampling_prob' must be a finite number"),
    (dict(POISSON, sampling_prob=1.5), "sampling_prob must be in \\(0, 1\\]"),
    (dict(POISSON, sampling_prob=[0.1]), "key 'sampling_prob' must be a finite number"),
    (dict(POISSON, extra=1), "unknown key 'extra'"),
    ({"name": "fixed-order", "epochs": 3, "steps": 10}, "steps must be a multiple of epochs"),
    ({"name": "balls-in-bins", "epochs": 2}, "key 'steps' is missing"),
    ({"name": "cyclic-poisson", "sampling_prob": 0.1, "steps": 10, "cycle_length": 2, "partition": "bogus"},
     "partition must be 'equal' or 'independent'"),
    ({"name": "cyclic-poisson", "sampling_prob": 0.1, "steps": 10, "cycle_length": 2, "partition": 3},
     "key 'partition' must be a string"),
    (dict(MINSEP, warm_start="yes"), "key 'warm_start' must be true or false"),
    (dict(MINSEP, max_batch_size=1.5), "key 'max_batch_size' must be an integer or null"),
    (dict(MINSEP, dataset_size=-3), "dataset_size must be an integer >= 1"),
    (dict(MINSEP, participation_rate=0.5), "key 'participation_rate' is 0.5 there"),
    ({"name": "multi-attribution-b-min-sep", "sampling_prob": 0.1, "steps": 10, "min_sep": 2,
      "max_user_examples": 3, "warmup_steps": -1}, "warmup_steps must be an integer >= 0"),
]


@pytest.mark.parametrize("d,match", BAD, ids=[m for _, m in BAD])
def test_malformed_descriptions_are_refused_naming_the_key(d, match):
    with pytest.raises(InvalidParameterError, match=match):
        scheme_from_dict(d)


@pytest.mark.parametrize("d", [None, [1], "poisson", 0.1])
def test_non_dict_is_refused(d):
    with pytest.raises(InvalidParameterError, match="must be a dict"):
        scheme_from_dict(d)


def test_any_edit_is_an_invalid_parameter_error_or_an_exact_rebuild():
    for s in ALL:
        d = _json(s.describe())
        for key in d:
            for other in (None, "x", -1, 0, [], {"k": 1}, 2.5, True, 1e300):
                edited = dict(d, **{key: other})
                if edited == d:
                    continue
                try:
                    back = scheme_from_dict(edited)
                except InvalidParameterError:
                    continue
                assert _json(back.describe()) == edited
