"""Fixtures for the transformer tests."""

import gin
import pytest


@pytest.fixture(autouse=True)
def _no_gin_config_leaks():
  """Each test starts and ends with an empty gin config, so bindings made (or
  files parsed) by one test never change another's model.
  """
  gin.clear_config()
  yield
  gin.clear_config()
