"""``examples/stdlib_gpt2.py --fast``: a GPT-2-architecture model (tied embeddings) on padded,
variable-length stdlib code, DP-SGD / BandMF / BLT calibrated to the same epsilon, every report
certified by its accountant, every row lowering the held-out bits/byte. Run in-process (a few seconds)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "stdlib_gpt2.py"


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("stdlib_gpt2", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    out = tmp_path_factory.mktemp("gpt2_fast")
    res = module.main(["--fast", "--out", str(out)])
    return module, out, res


def test_fast_mode_writes_its_outputs(fast):
    _, out, res = fast
    assert json.loads((out / "results.json").read_text())["summary"] == json.loads(json.dumps(res["summary"]))
    md = (out / "results.md").read_text()
    for label in ("non-private", "DP-SGD", "BandMF", "BLT"):
        assert label in md, label


def test_fast_mode_rows_are_certified_at_the_same_epsilon(fast):
    module, _, res = fast
    cfg = res["config"]
    assert cfg["fast"] is True and cfg["steps"] == cfg["epochs"] * cfg["steps_per_epoch"]
    private = [r for r in res["runs"] if r["mechanism"] != "non-private"]
    assert {r["mechanism"] for r in private} == {"dpsgd", "bandmf", "blt"}
    for r in private:
        assert r["method"] == module.METHODS[r["mechanism"]]
        assert cfg["epsilon"] * 0.98 <= r["certified_epsilon"] <= cfg["epsilon"]  # calibrated to it, never above


def test_fast_mode_data_are_padded_variable_length_and_the_model_tied(fast):
    module, _, res = fast
    corpus = module.StdlibLines(32, 60)
    lengths = corpus.mask.sum(1)
    assert int(lengths.min()) < 32 and int(lengths.max()) == 32 and len(set(lengths.tolist())) > 5
    assert bool(((corpus.labels == -100) == (corpus.mask == 0)).all())
    model = module.make_model(module.Config(**{**module.FAST, "seeds": (0,)}), 0)
    assert model.lm_head.weight is model.transformer.wte.weight


def test_fast_mode_every_row_learns(fast):
    _, _, res = fast
    for r in res["runs"]:
        assert r["bits_per_byte"] < r["initial_bits_per_byte"] - 0.3, r["mechanism"]


def test_the_model_names_its_loss_so_transformers_does_not_warn(fast):
    """transformers derives the loss from the class name ("GPT2LMHeadModel" names none) and warns
    "loss_type=None ... Using the default loss" on every run: the example names it (the same loss)."""
    import logging

    import torch
    from transformers.loss.loss_utils import LOSS_MAPPING

    module, _, _ = fast
    cfg = module.replace(module.Config(), **module.FAST)
    model = module.make_model(cfg, 0)
    assert model.loss_type == "ForCausalLM" and model.loss_function is LOSS_MAPPING["ForCausalLM"]
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("transformers").addHandler(handler)
    try:
        ids = torch.randint(0, 10, (2, 8))
        model(input_ids=ids, labels=ids).loss.backward()
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert not [r for r in records if "loss_type" in r.getMessage()]
