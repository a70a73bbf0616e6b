"""Tuning tests train tiny models: torch on one intra-op thread, as the training tests do."""

from tests.training.conftest import _one_thread  # noqa: F401  (an autouse fixture)
