"""Construction-time refusal of plain MirroredStrategy via CrossDeviceOps.__bool__ (mirrored_strategy.py:370)."""
import sys, tensorflow as tf
class Ours(tf.distribute.ReductionToOneDevice):
  def __bool__(self):
    ext = sys._getframe(1).f_locals.get("self")
    if isinstance(ext, tf.distribute.MirroredStrategy().extended.__class__) and not getattr(ext, "_tf_crossdevice_owner", False):
      raise ValueError("CollectiveAllReduce needs tf_crossdevice.MultiWorkerMirroredStrategy")
    return True
try:
  tf.distribute.MirroredStrategy(["/cpu:0"], cross_device_ops=Ours()); print("constructed (hook did not fire)")
except ValueError as e:
  print("MirroredStrategy construction raised:", e)
