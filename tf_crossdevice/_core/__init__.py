"""The package's foundations: argument checks, device strings, TF privates.

Nothing here is public. Every other folder may import from `_core`; `_core`
imports nothing of the package outside itself, and only `tf_internal` and
`requirements` import TensorFlow.
"""
