"""Packing many tensors into fewer, larger ones before they are reduced.

`_plan` decides (pure Python: which tensors go together, split sizes),
`_pack` does it in TensorFlow, `_collective_plan` groups the values of one
collective step into packs.

May import: `_core`.
"""

from tf_crossdevice.packing._pack import Packer, make_packer

__all__ = ["Packer", "make_packer"]
