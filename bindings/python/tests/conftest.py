"""Shared pytest setup for braid's Python tests: generic fixtures only (each test file keeps its own
helpers). The tests import the package from the build tree (PYTHONPATH=<build>/bindings/python)."""

import numpy as np
import pytest

import braid


@pytest.fixture
def rng():
    """A seeded NumPy generator: the independent source of test data."""
    return np.random.default_rng(12345)


@pytest.fixture(autouse=True)
def _restore_grad_mode():
    """A test that fails inside no_grad / set_grad_enabled(False) must not leave grad mode off for
    the next one."""
    enabled = braid.is_grad_enabled()
    yield
    braid.set_grad_enabled_(enabled)
