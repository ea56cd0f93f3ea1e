"""tf_crossdevice: TensorFlow 1's cross-device reductions for TensorFlow 2."""
