"""register_ghost_rule checks its mistakes where they are made (issue 51).

The layer types and the rule's signature at registration; what a rule returns at its call (naming the
rule and the layer), instead of a ``TypeError`` / ``AttributeError`` / ``KeyError`` from inside the
clipper at the first backward.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError  # noqa: E402
from dpmf.training.torch.ghost import (  # noqa: E402
    GHOST_RULES,
    GhostClipper,
    LayerGradients,
    PerExample,
    from_contributions,
    register_ghost_rule,
)


class Scale(torch.nn.Module):
    def __init__(self, d=4):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 2.0, d))

    def forward(self, x):
        return x * self.w


def _per(call):
    x, g = call.input, call.grad_output
    return (x * g).reshape(x.shape[0], -1, x.shape[-1]).sum(1)


@pytest.fixture(autouse=True)
def _forget_scale():
    yield
    GHOST_RULES.pop(Scale, None)


def _run(rule):
    """Register ``rule`` for Scale and run one clipped sum through a model using it."""
    register_ghost_rule(Scale)(rule)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), Scale(4), torch.nn.Linear(4, 2))
    x, y = torch.randn(6, 3), torch.randn(6, 2)
    ghost = GhostClipper(model, lambda out, y: ((out - y) ** 2).sum(1).mean(), max_grad_norm=1.0)
    try:
        return ghost.clipped_sum(x, y)
    finally:
        ghost.close()


def test_a_correct_rule_still_runs():
    def rule(module, call, trainable):
        return from_contributions({"w": PerExample(_per(call))}, trainable)

    assert _run(rule).norms.shape == (6,)


def test_no_layer_type_is_refused():
    with pytest.raises(InvalidParameterError, match=r"register_ghost_rule\(\) needs the layer types .*got none"):
        register_ghost_rule()


@pytest.mark.parametrize("bad", [5, "Scale", None])
def test_a_layer_type_that_is_not_a_module_class_is_refused_and_nothing_registered(bad):
    before = dict(GHOST_RULES)
    with pytest.raises(InvalidParameterError, match=rf"layer type {bad!r} is not a torch.nn.Module subclass"):
        register_ghost_rule(Scale, bad)
    assert GHOST_RULES == before and 5 not in GHOST_RULES


def test_the_decorator_without_parentheses_says_so():
    def rule(module, call, trainable):
        return None

    with pytest.raises(InvalidParameterError, match=r"write @register_ghost_rule\(MyLayer\)"):
        register_ghost_rule(rule)


def test_a_rule_that_is_not_callable_is_refused():
    with pytest.raises(InvalidParameterError, match="the rule must be a function rule.module, call, trainable., got 5"):
        register_ghost_rule(Scale)(5)
    assert Scale not in GHOST_RULES


def test_a_rule_with_a_wrong_signature_is_refused_naming_it():
    def two_args(module, call):
        return None

    with pytest.raises(InvalidParameterError, match=r"the rule .*two_args\(module, call\) cannot be called"):
        register_ghost_rule(Scale)(two_args)
    assert Scale not in GHOST_RULES


def test_a_rule_returning_junk_names_the_rule_and_the_layer():
    def junk(module, call, trainable):
        return {"sq": 1}

    with pytest.raises(InvalidParameterError, match=r"ghost rule .*junk returned a dict for layer '1'"):
        _run(junk)


def test_a_rule_returning_norms_of_the_wrong_shape_is_named():
    def wrong_shape(module, call, trainable):
        return LayerGradients(torch.zeros(3, dtype=torch.float64), lambda f: {"w": torch.zeros(4)})

    with pytest.raises(InvalidParameterError, match=r"wrong_shape returned sq = .*shape \(3,\) \(batch 6\).*'1'"):
        _run(wrong_shape)


def test_norms_given_as_a_function_are_checked_when_formed():
    def lazy_wrong(module, call, trainable):
        return LayerGradients(lambda: torch.zeros(3, dtype=torch.float64), lambda f: {"w": torch.zeros(4)})

    with pytest.raises(InvalidParameterError, match=r"lazy_wrong returned sq = .*shape \(3,\) \(batch 6\).*'1'"):
        _run(lazy_wrong)

    def lazy(module, call, trainable):
        eager = from_contributions({"w": PerExample(_per(call))}, trainable)
        return LayerGradients(lambda: eager.sq, eager.weighted_sum)

    def eager(module, call, trainable):
        return from_contributions({"w": PerExample(_per(call))}, trainable)

    got, want = _run(lazy), _run(eager)
    assert torch.equal(got.norms, want.norms) and all(torch.equal(a, b) for a, b in zip(got.grads, want.grads))


@pytest.mark.parametrize("sums, needle", [
    (lambda f: {"zzz": torch.zeros(4)}, r"parameters \['zzz'\], expected \['w'\]"),
    (lambda f: {}, r"parameters \[\], expected \['w'\]"),
    (lambda f: {"w": torch.zeros(5)}, r"'w' is \(5,\), expected a tensor of shape \(4,\)"),
    (lambda f: [torch.zeros(4)], "giving list, not a dict"),
])
def test_a_weighted_sum_with_missing_unknown_or_misshapen_parameters_is_named(sums, needle):
    def bad_sums(module, call, trainable):
        return LayerGradients((_per(call).double() ** 2).sum(1), sums)

    with pytest.raises(InvalidParameterError, match=rf"bad_sums returned .*{needle}"):
        _run(bad_sums)


def test_a_rule_giving_negative_norms_is_named_not_trained_on():
    """A negative squared norm would lower the example's total below its true norm, so it would be
    clipped too little: refused naming the rule, eager or formed later (the rule's own test, the same
    rule with its norms made non-negative, trains)."""
    def negative(module, call, trainable):
        right = from_contributions({"w": PerExample(_per(call))}, trainable)
        return LayerGradients(-1.0 - right.sq, right.weighted_sum)

    def lazy_negative(module, call, trainable):
        right = from_contributions({"w": PerExample(_per(call))}, trainable)
        return LayerGradients(lambda: -1.0 - right.sq, right.weighted_sum)

    def fixed(module, call, trainable):
        right = from_contributions({"w": PerExample(_per(call))}, trainable)
        return LayerGradients(1.0 + right.sq, right.weighted_sum)

    for rule in (negative, lazy_negative):
        with pytest.raises(InvalidParameterError, match=rf"{rule.__name__} returned a negative squared norm .*'1'"):
            _run(rule)
    assert _run(fixed).norms.shape == (6,)


def test_a_rule_giving_non_finite_norms_from_finite_data_is_named_not_blamed_on_the_data():
    def nan_norms(module, call, trainable):
        right = from_contributions({"w": PerExample(_per(call))}, trainable)
        return LayerGradients(right.sq * float("nan"), right.weighted_sum)

    with pytest.raises(InvalidParameterError, match=r"nan_norms returned a non-finite squared norm from a finite"):
        _run(nan_norms)


def test_an_error_inside_a_rule_names_the_rule_and_the_layer():
    def broken(module, call, trainable):
        return trainable["zzz"]

    with pytest.raises(InvalidParameterError, match=r"ghost rule .*broken failed on layer '1' \(Scale\): KeyError"):
        _run(broken)


def test_plain_gives_ordinary_autograd_on_a_private_model():
    """Ghost mode runs rule layers on detached parameters, so torch.autograd.grad with respect to them
    is refused (test_ghost_plain_grads); ``clipper.plain()`` is the documented way to plain gradients
    (the same as an unwrapped copy)."""
    import copy

    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import Identity
    from dpmf.training.torch import make_private

    torch.manual_seed(0)
    X, Y = torch.randn(32, 3), torch.randint(0, 2, (32,))
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    twin = copy.deepcopy(model)
    run = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.utils.data.TensorDataset(X, Y),
                       strategy=Identity(4), sampling=PoissonSampling(0.25, 4), noise_multiplier=1.0, delta=1e-5,
                       max_grad_norm=1.0, seed=0, accountant="unamplified", grad_sample_mode="ghost")
    loss = torch.nn.functional.cross_entropy(model(X[:4]), Y[:4])
    with pytest.raises(UnsupportedConfigurationError, match="clipper.plain"):  # what plain() is for
        torch.autograd.grad(loss, list(model.parameters()))
    before = sum(len(u.calls) for u in run.optimizer.clipper.units)
    with run.optimizer.clipper.plain():
        got = torch.autograd.grad(torch.nn.functional.cross_entropy(model(X[:4]), Y[:4]), list(model.parameters()))
    want = torch.autograd.grad(torch.nn.functional.cross_entropy(twin(X[:4]), Y[:4]), list(twin.parameters()))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert sum(len(u.calls) for u in run.optimizer.clipper.units) == before  # nothing captured inside


def test_rules_run_in_full_float32_whatever_the_users_setting():
    """The clipper's norms and sums run with float32 products in full float32 (a GPU allowed TF32 errs
    far beyond the rounding bounds the norms are inflated by); the user's setting is back afterwards."""
    seen = []

    def rule(module, call, trainable):
        seen.append((torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32))
        return from_contributions({"w": PerExample(_per(call))}, trainable)

    old = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    try:
        _run(rule)
        assert seen and all(s == ("highest", False) for s in seen)
        assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32) == ("high", True)
    finally:
        torch.set_float32_matmul_precision(old[0])
        torch.backends.cudnn.allow_tf32 = old[1]
