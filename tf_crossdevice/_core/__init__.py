"""The package's foundations: checks, devices, values, the reducer protocol.

`checks` holds the argument checks, `devices` device strings, `values` the
value model (what a reduction takes and gives back: `Item`, destinations,
MEAN, grouping of results), `reducer` the protocol each family of
algorithms implements, `tf_internal` TensorFlow's privates (isolated,
with the version they were checked against), `requirements` the
TensorFlow this package needs, `workers` groups devices by worker and
`network` asks whether a worker's port answers.

Nothing here is public. Every other folder may import from `_core`.
"""
