"""Rounding of softmax, sigmoid, sqrt and log as the original 0.1.21 rounded.

The values below are what the original mesh_tensorflow 0.1.21 computed (one
device, TF 2.21) for y = f(x) and d(sum(y * w))/dx. In bfloat16 every op
rounds, so only the original's op sequence gives its numbers: softmax outside
float32 is exp(log_softmax(x)) (the fused kernel differed by several ulps),
sigmoid's gradient is (y * (1 - y)) * dy, sqrt's dy * 0.5 / y and log's
dy / x.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu

B = mtf.Dimension("b", 2)
V = mtf.Dimension("v", 12)
X = [[(i * 12 + j) * 0.375 - 4.0 for j in range(12)] for i in range(2)]
W = [
  [((i * 12 + j) * 7 % 11) * 0.25 - 1.25 for j in range(12)] for i in range(2)
]

FUNCTIONS = {
  "softmax": lambda x: mtf.softmax(x, V),
  "sigmoid": mtf.sigmoid,
  "sqrt": lambda x: mtf.sqrt(mtf.abs(x) + 0.5),
  "log": lambda x: mtf.log(mtf.abs(x) + 0.5),
}

# "<dtype>/<function>": (y, dx) as the original computed them: the bytes of
# little-endian float32 arrays of shape [2, 12], in hex.
ORIGINAL = {
  "bfloat16/softmax": (
    (
      "0000a73b0000f23b0000303c0000803c0000bb3c0000083d0000463d0000903d"
      "0000d13d0000193e00005f3e0000a23e0000a73b0000f23b0000303c0000803c"
      "0000bb3c0000083d0000463d0000903d0000d13d0000183e00005d3e0000a13e"
    ),
    (
      "00008ebb0000da3b00008cba0000d43c0000723c00003ebc00008a3d0000e63c"
      "00007bbd0000303e0000033d00008abe00004c3b00003cbb0000703c0000ba3b"
      "00006ebc0000173d0000b13b000080bd0000b43d0000a8bc00007bbe0000453e"
    ),
  ),
  "bfloat16/sigmoid": (
    (
      "0000943c0000d53c0000193d00005b3d00009c3d0000db3d0000183e00004e3e"
      "00008a3e0000b33e0000df3e0000083f00001f3f0000353f0000463f0000563f"
      "0000613f00006a3f0000713f0000753f0000783f00007b3f00007c3f00007e3f"
    ),
    (
      "0000b5bc00004f3c000093bc0000813d0000903c000093bd0000013e00000000"
      "00004abe00002e3e00007bbd00009fbe0000f13d0000d4bd0000603e00000c3d"
      "0000a4bd0000a13d00000000000028bd0000ba3c00009dbb00009ebc00007e3b"
    ),
  ),
  "float32/sigmoid": (
    (
      "d157933c88a4d43c13e4183d72bd5a3d875b9b3d9b80da3dae99173e20a84e3e"
      "b0b2893e9f81b23e652ae03e56fd073f7f591f3f54ae343f1ffd463f3fe2553f"
      "eb7b613ff3366a3f299e703fbd39753ffe7e783f80cb7a3f53667c3fbf837d3f"
    ),
    (
      "b9ddb4bc811f4f3c192f93bc5f69813d88928f3c866492bd0428013e00000000"
      "a35449be0c682e3e930a7cbd6a609fbed0a4f03ddda2d4bdfc925d3ee9bf0c3d"
      "2745a1bd98739f3d00000000c42225bdc5d0ae3c072da3bb8cfc8dbceb849d3b"
    ),
  ),
  "bfloat16/sqrt": (
    (
      "00000840000002400000f83f0000eb3f0000de3f0000cf3f0000c03f0000af3f"
      "00009d3f0000883f00005e3f00004a3f0000803f0000963f0000a93f0000bb3f"
      "0000ca3f0000d93f0000e73f0000f43f000000400000064000000b4000001140"
    ),
    (
      "0000973e0000fcbd0000043e0000aebe000094bd00006d3e0000abbe00000080"
      "0000d13e0000b5be0000143e00004abf0000803e00005abe0000f23e0000af3d"
      "000073be0000973e00000000000086be0000403e000075bd000094be0000e23d"
    ),
  ),
  "float32/sqrt": (
    (
      "b6c3074010fc0140f6def73fa926eb3fd7b3dd3f3a62cf3f0000c03f6f45af3f"
      "71c49c3fb6c3873fd7b35d3fc2624a3f0000803fe317963ffd53a93f2897ba3f"
      "c262ca3fd908d93f5ac1e63f6ab4f33f0000004098dd05401a7c0b40dce21040"
    ),
    (
      "76d9963e6417fcbda532043e9a2faebe3acd93bd8b026d3eabaaaabe00000080"
      "ec05d13ef404b5be3acd133ec0624abfffff7f3e49515abeb4e5f13e539daf3d"
      "e7dc72be06fb963e00000000317586beffff3f3e67c874bd79d392beeb29e23d"
    ),
  ),
  "bfloat16/log": (
    (
      "0000c13f0000b53f0000a93f00009c3f00008d3f0000773f0000503f0000213f"
      "0000d03e0000f13d000093be0000f1be000000000000a33e00000f3f0000413f"
      "00006b3f0000873f0000973f0000a53f0000b13f0000bd3f0000c73f0000d13f"
    ),
    (
      "00008e3e0000f8bd0000093e0000bebe0000abbd0000923e0000e4be00000080"
      "00002b3f00002bbf0000ab3e000000c00000003f0000babe0000363f0000f13d"
      "00009abe0000b23e0000000000008dbe0000403e00006abd000087be0000c83d"
    ),
  ),
  "float32/log": (
    (
      "9c85c03f6b62b53f4c2fa93fd8b29b3f549f8c3f8b0f773f1f994f3f7fec203f"
      "1f99cf3e3a38f13d114b93be51a4f0be000000005e0ca33efb420f3f30f7403f"
      "08926a3fbc2c873f2bde963f69d8a43f1872b13f81eabc3f4871c73f302bd13f"
    ),
    (
      "e3388e3e0f3ef8bd8888083e30a1bdbeabaaaabd2549923e388ee3be00000080"
      "abaa2a3faaaa2abfabaaaa3effffffbfffffff3e8b2ebabe6ddb363ff0f0f03d"
      "999999be4316b23e00000000cb3d8dbeffff3f3ea10e6abda1bc86be0ccec73d"
    ),
  ),
}


def _decode(hex_string: str) -> np.ndarray:
  return np.frombuffer(bytes.fromhex(hex_string), "<f4").reshape(2, 12)


@pytest.mark.parametrize("case", sorted(ORIGINAL))
def test_values_and_gradients_round_as_the_original(case):
  dtype_name, function = case.split("/")
  dtype = tf.as_dtype(dtype_name)

  def build(mesh):
    x = mtf.import_tf_tensor(
      mesh, tf.cast(tf.constant(X), dtype), mtf.Shape([B, V])
    )
    w = mtf.import_tf_tensor(
      mesh, tf.cast(tf.constant(W), dtype), mtf.Shape([B, V])
    )
    y = FUNCTIONS[function](x)
    dx = mtf.gradients([mtf.reduce_sum(y * w)], [x])[0]
    return [mtf.cast(y, tf.float32), mtf.cast(dx, tf.float32)]

  y, dx = mtu.run_program(build)
  expected_y, expected_dx = (_decode(h) for h in ORIGINAL[case])
  np.testing.assert_array_equal(y, expected_y)
  np.testing.assert_array_equal(dx, expected_dx)


def test_float32_softmax_stays_within_rounding_of_the_original():
  """float32 keeps the fused kernel: within float32 rounding of 0.1.21."""

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(X), mtf.Shape([B, V]))
    return [mtf.softmax(x, V)]

  (y,) = mtu.run_program(build)
  reference = tf.nn.softmax(tf.constant(X), axis=-1).numpy()
  np.testing.assert_allclose(y, reference, rtol=1e-6, atol=1e-7)
