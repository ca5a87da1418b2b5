"""per_example_causal_lm_loss checks its labels (issue 51): float labels, labels out of range and
``-1`` as padding are one InvalidParameterError saying what is valid (``-100`` is the ignore index),
instead of a raw torch error (or a device-side assert on a GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dpmf.errors import InvalidParameterError  # noqa: E402
from dpmf.training.torch import per_example_causal_lm_loss  # noqa: E402

B, T, V = 2, 5, 7


def _logits():
    return torch.randn(B, T, V, generator=torch.Generator().manual_seed(0))


def _labels():
    return torch.tensor([[1, 2, 3, 4, 5], [6, 0, 1, -100, -100]])


def test_valid_labels_with_the_ignore_index_still_give_the_loss():
    per = per_example_causal_lm_loss(_logits(), _labels(), reduction="none")
    assert per.shape == (B,) and bool(torch.isfinite(per).all())


def test_float_labels_are_refused():
    with pytest.raises(InvalidParameterError, match=r"labels must be an integer tensor of token ids .*got torch\.float32"):
        per_example_causal_lm_loss(_logits(), _labels().float())


def test_bool_labels_are_refused():
    with pytest.raises(InvalidParameterError, match=r"labels must be an integer tensor .*got torch\.bool"):
        per_example_causal_lm_loss(_logits(), _labels() > 2)


def test_a_label_past_the_vocabulary_is_named_with_its_position():
    labels = _labels()
    labels[1, 2] = V
    with pytest.raises(InvalidParameterError, match=rf"labels hold {V} at \(example, position\) \(1, 2\): .*\[0, {V}\)"):
        per_example_causal_lm_loss(_logits(), labels)


def test_minus_one_as_padding_says_minus_100_is_the_ignore_index():
    labels = _labels()
    labels[1, 3:] = -1
    with pytest.raises(InvalidParameterError, match=r"labels hold -1 at \(example, position\) \(1, 3\).*ignore_index=-100, "
                                                    r"which marks padding"):
        per_example_causal_lm_loss(_logits(), labels)


def test_without_shift_every_position_is_checked_and_with_it_the_first_is_not_scored():
    labels = _labels()
    labels[0, 0] = -1  # never scored under the causal shift
    per_example_causal_lm_loss(_logits(), labels)
    with pytest.raises(InvalidParameterError, match=r"labels hold -1 at \(example, position\) \(0, 0\)"):
        per_example_causal_lm_loss(_logits(), labels, shift=False)


def test_another_ignore_index_is_honoured():
    labels = _labels()
    labels[1, 3:] = -1
    per = per_example_causal_lm_loss(_logits(), labels, reduction="none", ignore_index=-1)
    torch.testing.assert_close(per, per_example_causal_lm_loss(_logits(), _labels(), reduction="none"))
