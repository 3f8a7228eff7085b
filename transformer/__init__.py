"""The Mesh TensorFlow Transformer library (also `mesh_tensorflow.transformer`).

Models, layers and the training driver arrive with their own issues; this
package exists now so that both import paths resolve to the same modules.
"""
