"""Test setup: 8 virtual CPU devices, configured before TensorFlow initialises."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # pylint: disable=g-import-not-at-top

NUM_VIRTUAL_CPUS = 8

# Configure before anything initialises the runtime: list_logical_devices()
# would initialise it (with one CPU) and make the configuration fail.
_cpus = tf.config.list_physical_devices("CPU")
try:
  tf.config.set_logical_device_configuration(
      _cpus[0],
      [tf.config.LogicalDeviceConfiguration()] * NUM_VIRTUAL_CPUS)
except RuntimeError:  # Already initialised by an earlier import.
  pass
