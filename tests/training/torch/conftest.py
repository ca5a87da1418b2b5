"""Fixtures shared by the PyTorch integration tests."""

import pytest


@pytest.fixture
def quiet_transformers():
    """transformers' logging at error level for the test (its notices about configs built in the
    tests are not what they check), restored after."""
    transformers = pytest.importorskip("transformers")
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    yield
    transformers.logging.set_verbosity(level)
