"""mesh_tensorflow.experimental: a 3-D U-Net with spatial partitioning.

Modules (import them by name, as in the original):
  data_aug_lib: data augmentation of 3-D CT volumes.
  input_reader: input pipelines that deliver each processor its slices.
  unet: a U-Net whose spatial dims are split over the mesh.
  model_executor: a train/eval loop for the U-Net (entry point).
  offline_data_aug: writes augmented volumes to TFRecords (entry point).
"""
