"""Gating cases run identically against this package and the original.

`run_case` builds one gating function of mesh_tensorflow.transformer.moe on
fixed inputs and router weights in a TF1-style graph and returns its
dispatch, combine and loss as numpy arrays. The same code, run against the
original 0.1.21 package by `data/make_moe_gating_original.py`, wrote the
reference outputs in data/moe_gating_original.npz that
moe_gating_original_test.py compares against.

Only cases the original can run are listed (its z-loss needs
num_microbatches, its ntlb gating does not build, and its random policies
draw numbers that no second implementation can reproduce).
"""

import numpy as np
import tensorflow as tf

OUTER, GROUPS, GROUP, D_MODEL, EXPERTS = 1, 2, 8, 4, 4

# (gating, extra settings); hparams override the deterministic defaults of
# `_hparams`.
CASES = [
  ("top_2", {}),
  ("top_2", {"importance": True}),
  ("top_2", {"hparams": {"moe_use_second_place_loss": 1}}),
  ("top_2", {"embed": True, "hparams": {"moe_word_embed_mode": "concat"}}),
  ("top_2", {"embed": True, "hparams": {"moe_word_embed_mode": "add"}}),
  ("top_2", {"importance": True, "train": True}),
  (
    "top_2",
    {
      "importance": True,
      "train": True,
      "num_microbatches": 2,
      "hparams": {"moe_z_loss": 0.1, "moe_second_policy_train": "threshold"},
    },
  ),
  ("top_n", {}),
  ("top_n", {"importance": True}),
  ("top_n", {"hparams": {"moe_use_second_place_loss": 1}}),
  (
    "top_n",
    {
      "importance": True,
      "train": True,
      "num_microbatches": 1,
      "hparams": {"moe_z_loss": 0.1},
    },
  ),
  ("switch", {}),
  ("switch", {"importance": True}),
  ("switch", {"embed": True, "hparams": {"moe_word_embed_mode": "concat"}}),
  (
    "switch",
    {
      "importance": True,
      "train": True,
      "num_microbatches": 1,
      "hparams": {"moe_z_loss": 0.1},
    },
  ),
  (
    "switch",
    {
      "importance": True,
      "train": True,
      "embed": True,
      "hparams": {"moe_word_embed_mode": "add_stop_grad"},
    },
  ),
  ("switch_max", {}),
  ("switch_max", {"importance": True}),
  (
    "switch_max",
    {
      "importance": True,
      "train": True,
      "num_microbatches": 2,
      "hparams": {"moe_z_loss": 0.1},
    },
  ),
  ("expert_selection", {"importance": True}),
  ("expert_selection", {"importance": True, "capacity": 2}),
  (
    "expert_selection",
    {
      "importance": True,
      "embed": True,
      "hparams": {"moe_word_embed_mode": "embed_only"},
    },
  ),
  (
    "expert_selection",
    {
      "importance": True,
      "train": True,
      "num_microbatches": 1,
      "hparams": {"moe_z_loss": 0.1},
    },
  ),
]


def _hparams(moe, gating, overrides):
  hparams = moe.HParams(moe_gating=gating)
  moe.set_default_moe_hparams(hparams)
  settings = {
    "moe_switch_policy_train": "argmax",
    "moe_switch_policy_eval": "argmax",
    "moe_switch_dropout": 0.1,
    "moe_switch_temperature": 1.0,
    "moe_switch_jitter": 1e-2,
    "moe_ntlb_top_k": 3,
    "moe_z_loss": None,
    "moe_word_embed_mode": None,
    "moe_use_second_place_expert_prob": None,
    "moe_use_second_place_expert_prob_temp": None,
    "moe_top_n_num_experts_per_token": 3,
    "moe_second_policy_train": "all",
    "moe_second_policy_eval": "all",
  }
  settings.update(overrides)
  for name, value in settings.items():
    if hasattr(hparams, name):
      setattr(hparams, name, value)
    else:
      hparams.add_hparam(name, value)
  return hparams


def run_case(mtf, moe, index):
  """Runs CASES[index]; returns (dispatch, combine, loss) as numpy arrays.

  dispatch and combine are transposed to [outer_batch, groups, group,
  experts, expert_capacity] whatever order the gating returns.
  """
  gating, settings = CASES[index]
  rng = np.random.RandomState(index)
  graph = tf.Graph()
  with graph.as_default():
    mtf_graph = mtf.Graph()
    mesh = mtf.Mesh(mtf_graph, "mesh")
    dims = [
      mtf.Dimension("outer_batch", OUTER),
      mtf.Dimension("batch", GROUPS),
      mtf.Dimension("group", GROUP),
      mtf.Dimension("d_model", D_MODEL),
    ]
    shape = [OUTER, GROUPS, GROUP, D_MODEL]
    inputs = mtf.import_tf_tensor(
      mesh, tf.constant(rng.randn(*shape).astype(np.float32)), mtf.Shape(dims)
    )
    importance = None
    if settings.get("importance"):
      values = (rng.rand(*shape[:3]) > 0.3).astype(np.float32)
      values[..., 0] = 0.5
      importance = mtf.import_tf_tensor(
        mesh, tf.constant(values), mtf.Shape(dims[:3])
      )
    token_embeddings = None
    if settings.get("embed"):
      token_embeddings = mtf.import_tf_tensor(
        mesh,
        tf.constant(rng.randn(*shape).astype(np.float32)),
        mtf.Shape(dims),
      )
    experts_dim = mtf.Dimension("expert_unsplit", EXPERTS)
    capacity_dim = mtf.Dimension("expert_capacity", settings.get("capacity", 3))
    kwargs = dict(
      inputs=inputs,
      outer_expert_dims=None,
      experts_dim=experts_dim,
      expert_capacity_dim=capacity_dim,
      hparams=_hparams(moe, gating, settings.get("hparams", {})),
      train=settings.get("train", False),
      variable_dtype=mtf.VariableDType(),
      importance=importance,
      num_microbatches=settings.get("num_microbatches"),
      token_embeddings=token_embeddings,
    )
    if gating == "expert_selection":
      kwargs["group_size_dim"] = dims[2]
    gating_fn = getattr(moe, "_%s_gating" % gating)
    dispatch, combine, loss = gating_fn(**kwargs)
    order = mtf.Shape(dims[:3] + [experts_dim, capacity_dim])
    outputs = [
      mtf.transpose(dispatch, order),
      mtf.transpose(combine, order),
      loss,
    ]
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      mtf.Shape([]), mtf.LayoutRules([]), [""]
    )
    lowering = mtf.Lowering(mtf_graph, {mesh: mesh_impl})
    tf_outputs = [lowering.export_to_tf_tensor(t) for t in outputs]
    (router,) = mtf_graph.trainable_variables
    router_slice = lowering.variables[router].laid_out_tensor.all_slices[0]
    router_value = (
      np.random.RandomState(7)
      .randn(*router.shape.to_integer_list)
      .astype(np.float32)
    )
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(router_slice.assign(router_value))
      return session.run(tf_outputs)


# Layer cases: (layer module, class name, constructor kwargs, mode). Every
# trainable variable is set from a RandomState seeded by the case index, in
# the order of sorted variable names.
LAYER_CASES = [
  (
    "moe",
    "MoE1D",
    dict(num_experts=4, hidden_size=6, group_size=8, second_policy_eval="all"),
    "eval",
  ),
  (
    "moe",
    "MoE1D",
    dict(
      num_experts=4,
      hidden_size=6,
      group_size=4,
      moe_gating="switch",
      switch_policy_eval="argmax",
    ),
    "eval",
  ),
  (
    "moe",
    "MoE1D",
    dict(
      num_experts=4,
      hidden_size=6,
      group_size=8,
      moe_gating="expert_selection",
      switch_policy_eval="argmax",
      min_expert_capacity=2,
    ),
    "eval",
  ),
  (
    "heterogeneous_moe",
    "HeterogeneousMoE1D",
    dict(
      num_experts=4,
      hidden_size=3,
      group_size=8,
      second_policy_eval="all",
      moe_num_layers=2,
    ),
    "eval",
  ),
  (
    "heterogeneous_moe",
    "HeterogeneousMoE1D",
    dict(
      num_experts=4,
      hidden_size=1,
      group_size=8,
      second_policy_eval="all",
      heterogeneous_mask_info=[
        {"percent_number": 0.25, "layers": 1, "width": 1},
        {"percent_number": 0.75, "layers": 3, "width": 2},
      ],
    ),
    "eval",
  ),
  (
    "heterogeneous_moe",
    "HeterogeneousMoE1D",
    dict(
      num_experts=4,
      hidden_size=3,
      group_size=8,
      moe_gating="top_n",
      second_policy_eval="all",
      moe_num_layers=2,
      heterogeneous_mask_info=[
        {"percent_number": 0.5, "layers": 2, "width": 1},
        {"percent_number": 0.5, "layers": 1, "width": 1},
      ],
    ),
    "eval",
  ),
]


class _Model:
  """The attributes of a Unitransformer that the layers read."""

  def __init__(self, mtf, d_model):
    self.model_dim = d_model
    self.layout = mtf.convert_to_layout_rules("")
    self.mesh_shape = mtf.convert_to_shape("")
    self.ensemble_dims = []
    self.ensemble_dim = None
    self.fully_autoregressive = False
    self.autoregressive = False


def run_layer_case(mtf, transformer_package, index):
  """Runs LAYER_CASES[index]; returns (output, loss) as numpy arrays.

  Args:
    mtf: the mesh_tensorflow package under test.
    transformer_package: its transformer package (with a `transformer`
      module holding Context and the layer modules).
    index: the case.
  """
  module_name, class_name, kwargs, mode = LAYER_CASES[index]
  layer_module = getattr(transformer_package, module_name)
  rng = np.random.RandomState(100 + index)
  batch = mtf.Dimension("batch", 2)
  length = mtf.Dimension("length", 4)
  d_model = mtf.Dimension("d_model", D_MODEL)
  graph = tf.Graph()
  with graph.as_default():
    mtf_graph = mtf.Graph()
    mesh = mtf.Mesh(mtf_graph, "mesh")
    # The second sequence ends with a padding position.
    sequence_id = mtf.import_tf_tensor(
      mesh,
      tf.constant([[1, 1, 1, 1], [1, 1, 1, 0]], tf.int32),
      mtf.Shape([batch, length]),
    )
    context = transformer_package.transformer.Context(
      _Model(mtf, d_model),
      mesh,
      [batch],
      length,
      mtf.VariableDType(),
      mode=mode,
      sequence_id=sequence_id,
      losses=[],
    )
    x = mtf.import_tf_tensor(
      mesh,
      tf.constant(rng.randn(2, 4, D_MODEL).astype(np.float32)),
      mtf.Shape([batch, length, d_model]),
    )
    with tf.compat.v1.variable_scope("layer"):
      y = getattr(layer_module, class_name)(**kwargs).call(context, x)
    loss = context.losses[0]
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      mtf.Shape([]), mtf.LayoutRules([]), [""]
    )
    lowering = mtf.Lowering(mtf_graph, {mesh: mesh_impl})
    outputs = [lowering.export_to_tf_tensor(t) for t in (y, loss)]
    variables = sorted(mtf_graph.trainable_variables, key=lambda v: v.name)
    assigns = []
    for variable in variables:
      value = rng.randn(*variable.shape.to_integer_list).astype(np.float32)
      laid_out = lowering.variables[variable].laid_out_tensor
      assigns.append(laid_out.all_slices[0].assign(value))
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(assigns)
      return session.run(outputs)
