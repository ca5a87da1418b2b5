"""The exact per-example norm of an embedding lookup's gradient (``Factored.sq_alone``, index form):
the compiled grouping (``ghost/_index_compiled.py``, CPU) equals the tensor path and a float64
per-example definition, with repeated rows, padding positions and empty groups (issue 52, item 3)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dpmf.training.torch.ghost.joint import Factored  # noqa: E402


def definition(ids, G, keep, rows):
    """``sum_v ||sum_{t: x_t = v} g_t||^2`` per example, float64, one-hot products."""
    onehot = torch.nn.functional.one_hot(ids, rows).double()
    if keep is not None:
        onehot = onehot * keep.unsqueeze(-1).double()
    per = onehot.transpose(1, 2) @ G.double()  # (B, rows, d): each example's gradient of the table
    return (per * per).sum((1, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B, T, rows, d, pad", [(6, 40, 5, 3, False), (4, 9, 7, 2, True), (3, 1, 4, 5, True)])
def test_compiled_grouping_equals_the_tensor_path_and_the_definition(dtype, B, T, rows, d, pad):
    torch.manual_seed(B + T)
    ids = torch.randint(0, rows, (B, T))
    G = torch.randn(B, T, d, dtype=dtype) * torch.logspace(-3, 3, B, dtype=dtype).view(-1, 1, 1)
    keep = (ids != 1) if pad else None
    f = Factored(ids, G, rows=rows, keep=keep)
    got, tensors = f.sq_alone(), f._grouped_sq_norms_tensors()
    assert got.dtype == torch.float64 and got.shape == (B,)
    assert torch.allclose(got, tensors, rtol=1e-13, atol=0)
    assert torch.allclose(got, definition(ids, G, keep, rows), rtol=1e-12, atol=0)
    if pad:
        all_padded = torch.ones_like(ids)  # every position padding: no gradient
        assert torch.equal(Factored(all_padded, G, rows=rows, keep=all_padded != 1).sq_alone(), torch.zeros(B, dtype=torch.float64))
