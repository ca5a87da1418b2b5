"""The options of an audit as one frozen value (dpmf.auditing.config): checked and normalized when
made, before any training (no torch needed)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpmf.auditing.config import AuditConfig
from dpmf.errors import InvalidParameterError


def test_defaults_and_normalization():
    c = AuditConfig(canaries=np.int64(300), seed=np.int32(7), confidence=0.9, reference_trials=0)
    assert type(c.canaries) is int and c.canaries == 300 and type(c.seed) is int and c.seed == 7
    assert c.white_box and c.builtin and c.per_run == 300 and c.mode == "one-run" and c.reference_trials == 0
    many = AuditConfig(canaries=12, runs=12, threat="black-box")
    assert many.per_run == 1 and many.mode == "many-run" and not many.white_box
    assert set(c.privacy_options()) == {"strategy", "sampling", "delta", "max_grad_norm", "noise_multiplier",
                                        "target_epsilon", "accountant", "accountant_options"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.canaries = 5
    assert dataclasses.replace(c, runs=300).mode == "many-run"  # (checked again when replaced)
    with pytest.raises(TypeError):
        AuditConfig(1000)  # keywords only


@pytest.mark.parametrize("kwargs,needle", [
    (dict(threat="grey-box"), "threat"),
    (dict(canaries=1), "at least 2 canaries"),
    (dict(canaries=0), "canaries"),
    (dict(runs=3, canaries=5), "canaries must equal runs"),
    (dict(confidence=1.0), "confidence"),
    (dict(seed=-1), "seed"),
    (dict(seed=True), "seed"),
    (dict(learning_rate=0.0), "learning_rate"),
    (dict(reference_trials=-2), "reference_trials"),
    (dict(threat="black-box", runs=4, canaries=4, canary_data=([0], [0])), "canary_data"),
    (dict(dataset=[(0, 0)]), "go with model="),
    (dict(canary_data=([0], [0])), "canary_data goes with your own model"),
    (dict(model=object(), dataset=[(0, 0)]), "dataset= and loss_fn="),
    (dict(model=object(), dataset=[(0, 0)], loss_fn=len, num_examples=3), "num_examples"),
])
def test_bad_options_name_themselves(kwargs, needle):
    with pytest.raises(InvalidParameterError, match=needle):
        AuditConfig(**kwargs)
