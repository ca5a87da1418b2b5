"""Per-example losses for padded sequence batches, and the guard that keeps a model's own loss per example.

Per-example clipping bounds what one example adds to the *sum* of clipped gradients only when the
batch loss is a sum (or a mean with the batch size as divisor) of per-example losses,
``L = sum_i l_i`` or ``L = (1/B) sum_i l_i`` (``loss_reduction``; :mod:`~dpmf.training.torch.ghost.clipper`).
A Hugging Face causal-LM head computes instead a *token* mean over the whole batch,

    L_HF = sum_i sum_t l_it / N,      N = number of labels != -100 in the batch,

so example ``j``'s gradient is scaled by ``1 / N``, and ``N`` depends on every other example's length:
replacing one example changes the weight of all the others, and no per-example clip bounds that.
(Without ignored labels ``N = B (T - 1)`` is the same for every batch of that shape and ``L_HF`` equals
the per-example form below; the coupling comes from padding labelled ``-100``.)

:func:`per_example_causal_lm_loss` computes the per-example form: each sequence's own mean (or sum)
over its non-ignored next-token losses, shifted as Hugging Face shifts them (position ``t`` of the
logits predicts label ``t + 1``), then the batch reduced as ``loss_reduction`` says:

    l_i = sum_t m_it CE(z_{i,t}, y_{i,t+1}) / max(1, sum_t m_it),   m_it = [y_{i,t+1} != -100]
    L = (1/B) sum_i l_i  ("mean")   or   sum_i l_i  ("sum")

A sequence with no label left contributes 0 (and still counts in ``B``, which is public under the
plan's normalizer and the clipper's scaling).

:func:`guard_model_loss` attaches forward hooks to the ``transformers`` models inside a module so
that ``model(**batch).loss`` is per-example: a causal-LM head (``*ForCausalLM``, ``GPT2LMHeadModel``
...) has ``labels`` taken out of its forward and its ``.loss`` recomputed by
:func:`per_example_causal_lm_loss`; any other head called with labels equal to ``-100`` (token
classification, sequence-to-sequence, masked LM: the same token mean) is refused, with what to pass
instead (:func:`per_example_seq2seq_loss` for an encoder-decoder). ``make_private`` installs it for the loss.backward() loop (ghost mode) and Opacus mode.
Opacus' ghost criterion averages each sequence over its own tokens in the same way when given
``shape=``.
"""

from __future__ import annotations

import inspect

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.training.torch._deps import require_torch

torch = require_torch()

__all__ = ["per_example_causal_lm_loss", "per_example_seq2seq_loss", "guard_model_loss", "is_causal_lm"]

IGNORE_INDEX = -100
_REDUCTIONS = ("mean", "sum", "none")


def per_example_causal_lm_loss(logits, labels, *, reduction: str = "mean", token_reduction: str = "mean",
                               ignore_index: int = IGNORE_INDEX, shift: bool = True):
    """Next-token cross-entropy per sequence, then over the batch (module docstring).

    Args:
        logits: ``(B, T, V)`` scores (float16/bfloat16 are upcast to float32, as Hugging Face does).
        labels: ``(B, T)`` token ids, ``ignore_index`` where there is nothing to predict (padding).
        reduction: over the batch: ``"mean"`` (divide by ``B``, ``loss_reduction="mean"``), ``"sum"``
            (``loss_reduction="sum"``) or ``"none"`` (the ``(B,)`` per-example losses).
        token_reduction: within a sequence: ``"mean"`` over its own non-ignored labels (the per-example
            analogue of Hugging Face's loss) or ``"sum"``.
        shift: ``True`` (causal LM): logits at ``t`` are scored against ``labels[:, t + 1]``; ``False``
            (token classification): against ``labels[:, t]``.

    >>> logits = torch.zeros(2, 3, 4)                         # uniform: every token costs log 4
    >>> labels = torch.tensor([[1, 2, 3], [1, 2, -100]])      # the second sequence is padded
    >>> per_example_causal_lm_loss(logits, labels, reduction="none", token_reduction="sum") / torch.log(torch.tensor(4.0))
    tensor([2., 1.])
    """
    if reduction not in _REDUCTIONS:
        raise InvalidParameterError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if token_reduction not in ("mean", "sum"):
        raise InvalidParameterError(f"token_reduction must be 'mean' or 'sum', got {token_reduction!r}")
    if not isinstance(logits, torch.Tensor) or logits.ndim != 3:
        raise InvalidParameterError(f"logits must be a (B, T, V) tensor, got {_shape(logits)}")
    if not isinstance(labels, torch.Tensor) or labels.shape != logits.shape[:2]:
        raise InvalidParameterError(f"labels must have shape {tuple(logits.shape[:2])} (B, T) like the logits, "
                                    f"got {_shape(labels)}")
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise InvalidParameterError(f"labels must be an integer tensor of token ids (e.g. torch.long), got {labels.dtype}; "
                                    f"mark positions with nothing to predict with ignore_index={ignore_index}")
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    labels = labels.to(logits.device)
    if shift:
        logits, labels = logits[:, :-1], labels[:, 1:]
    _check_label_range(labels, logits.shape[-1], ignore_index, 1 if shift else 0)
    B = logits.shape[0]
    tok = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, ignore_index=ignore_index,
                                            reduction="none")  # (B, T'), 0 where ignored
    per = tok.sum(1)
    if token_reduction == "mean":
        per = per / (labels != ignore_index).sum(1).clamp_min(1).to(per.dtype)
    if reduction == "none":
        return per
    return per.sum() / max(B, 1) if reduction == "mean" else per.sum()


def per_example_seq2seq_loss(logits, labels, *, ignore_index: int = IGNORE_INDEX, reduction: str = "mean",
                             token_reduction: str = "mean"):
    """Cross-entropy of an encoder-decoder's outputs per target sequence, then over the batch:
    :func:`per_example_causal_lm_loss` without the shift (the labels of a sequence-to-sequence head --
    T5, mT5, BART -- are aligned with the decoder's outputs: ``logits[:, t]`` scores ``labels[:, t]``).

        l_i = sum_t m_it CE(z_{i,t}, y_{i,t}) / max(1, sum_t m_it),   m_it = [y_{i,t} != ignore_index]

    Call the model without ``labels`` (its own ``.loss`` averages over the whole batch's tokens) and
    with ``decoder_input_ids`` made from them (``model.prepare_decoder_input_ids_from_labels(labels=labels)``,
    which shifts right and replaces ``-100`` by the pad token, as the model does with ``labels``).

    >>> logits = torch.zeros(2, 3, 4)                         # uniform: every token costs log 4
    >>> labels = torch.tensor([[1, 2, 3], [1, -100, -100]])   # the second target is padded
    >>> per_example_seq2seq_loss(logits, labels, reduction="none", token_reduction="sum") / torch.log(torch.tensor(4.0))
    tensor([3., 1.])
    """
    return per_example_causal_lm_loss(logits, labels, reduction=reduction, token_reduction=token_reduction,
                                      ignore_index=ignore_index, shift=False)


def _check_label_range(labels, vocab: int, ignore_index: int, offset: int) -> None:
    """Every scored label is a token id in ``[0, vocab)`` or ``ignore_index`` (one error naming the first
    other value, instead of a device assert or an ``IndexError`` inside ``cross_entropy``). ``offset``: the
    shift dropped the first position. Not under ``torch.func`` transforms (functorch mode runs the loss per
    example inside ``vmap``, where a data-dependent check cannot run; ``cross_entropy`` still checks)."""
    if torch._C._functorch.is_functorch_wrapped_tensor(labels):
        return
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= vocab))
    if bool(bad.any()):
        i, t = (int(k) for k in bad.nonzero()[0])
        value, where = int(labels[i, t]), (i, t + offset)  # the position in the labels as given
        raise InvalidParameterError(
            f"labels hold {value} at (example, position) {where}: a label must be a token id in [0, {vocab}) (the "
            f"logits' last dimension) or ignore_index={ignore_index}, which marks padding (Hugging Face's -100; "
            "not -1 or the pad token's id unless you pass it as ignore_index)"
        )


def _shape(x) -> str:
    return f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def _is_hf_model(module) -> bool:
    return any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers")
               for c in type(module).__mro__)


def is_causal_lm(module) -> bool:
    """True for a ``transformers`` model whose head is a causal language model (the class names the
    ``Trainer`` treats as causal LMs, and ``*ForCausalLM`` / ``*LMHeadModel``)."""
    if not _is_hf_model(module):
        return False
    name = type(module).__name__
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return True
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:  # pragma: no cover - a transformers without the mapping
        return False
    return name in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def _outer_hf_models(module) -> list:
    """The ``transformers`` models in ``module`` not inside another one (a PEFT wrapper's base model)."""
    found, inside = [], []
    for name, m in module.named_modules():
        if any(p == "" or name.startswith(p + ".") for p in inside):
            continue
        if _is_hf_model(m):
            found.append(m)
            inside.append(name)
    return found


class _CausalLMLoss:
    """Forward hooks on one causal-LM model: labels out of the call, per-example ``.loss`` into the output."""

    def __init__(self, model, loss_reduction: str) -> None:
        self.model, self.loss_reduction = model, loss_reduction
        self.signature = inspect.signature(model.forward)
        self.labels: list = []

    def pre(self, module, args, kwargs):
        if args:  # positional arguments beyond input_ids: bind them to names so labels cannot hide there
            bound = self.signature.bind_partial(*args, **kwargs).arguments
            extra = bound.pop("kwargs", {})
            args, kwargs = (), {**bound, **extra}
        labels, shifted = kwargs.get("labels"), kwargs.get("shift_labels")
        if labels is None and shifted is None:
            self.labels.append(None)
            return None
        kwargs = {k: v for k, v in kwargs.items() if k not in ("labels", "shift_labels", "num_items_in_batch")}
        self.labels.append((labels, True) if shifted is None else (shifted, False))
        return args, kwargs

    def post(self, module, args, kwargs, output):
        got = self.labels.pop() if self.labels else None
        if got is None:
            return None
        labels, shift = got
        logits = output["logits"] if isinstance(output, dict) else (
            getattr(output, "logits", None) if not isinstance(output, tuple) else output[0])
        if logits is None:
            raise UnsupportedConfigurationError(
                f"{type(module).__name__} returned no logits; compute the loss per example yourself "
                "(dpmf.training.torch.per_example_causal_lm_loss)")
        loss = per_example_causal_lm_loss(logits, labels, reduction=self.loss_reduction, shift=shift)
        if isinstance(output, tuple):
            return (loss,) + output
        output["loss"] = loss
        return output


def _refuse_padded_labels(module, args, kwargs):
    labels = kwargs.get("labels")
    if isinstance(labels, torch.Tensor) and labels.ndim >= 1 and bool((labels == IGNORE_INDEX).any()):
        raise UnsupportedConfigurationError(
            f"{type(module).__name__} was called with labels containing {IGNORE_INDEX} (padding): its own .loss "
            "averages over the non-ignored labels of the whole batch, so one example's length changes every "
            "other example's weight and per-example clipping does not bound it. Call the model without "
            f"labels and backpropagate a per-example loss reduced over the batch, e.g. {_per_example_hint(module)}"
        )


def _per_example_hint(module) -> str:
    if getattr(getattr(module, "config", None), "is_encoder_decoder", False):
        return ("for a sequence-to-sequence head, out = model(input_ids=..., attention_mask=..., decoder_input_ids="
                "model.prepare_decoder_input_ids_from_labels(labels=labels)) and "
                "dpmf.training.torch.per_example_seq2seq_loss(out.logits, labels)")
    return "dpmf.training.torch.per_example_causal_lm_loss(out.logits, labels, shift=False) for token labels"


def guard_model_loss(module, loss_reduction: str = "mean") -> list:
    """Make ``module(**batch).loss`` per-example for the ``transformers`` models inside ``module``
    (module docstring). Returns the hook handles (``.remove()`` them to undo); none for other models."""
    if loss_reduction not in ("mean", "sum"):
        raise InvalidParameterError(f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")
    handles = []
    for m in _outer_hf_models(module):
        if is_causal_lm(m):
            fix = _CausalLMLoss(m, loss_reduction)
            handles.append(m.register_forward_pre_hook(fix.pre, with_kwargs=True))
            handles.append(m.register_forward_hook(fix.post, with_kwargs=True))
        else:
            handles.append(m.register_forward_pre_hook(_refuse_padded_labels, with_kwargs=True))
    return handles
