"""Q5 probe. usage: q5.py MODE(sub|plain) TASK PORT0 PORT1
sub:   subclass of tf.distribute.MultiWorkerMirroredStrategy whose extended overrides
       _initialize_local_devices (2 logical CPUs/worker), with collectives pre-enabled by us
       (no coordination service, no check-health barrier).
plain: tf.distribute.MirroredStrategy(local 2 CPUs, cross_device_ops=TF CollectiveAllReduce(group_size=4))."""
import os, sys, time, copy
import numpy as np
MODE, TASK = sys.argv[1], int(sys.argv[2]); PORTS = [int(sys.argv[3]), int(sys.argv[4])]
T0 = time.time()
def log(*a): print(f"[{MODE} t{TASK} {time.time()-T0:6.2f}s]", *a, flush=True)
os.environ.pop("TF_CONFIG", None)
import tensorflow as tf, keras; keras.config.disable_traceback_filtering()
from tensorflow.python.eager import context
from tensorflow.core.protobuf import tensorflow_server_pb2
from tensorflow.python.distribute import collective_all_reduce_strategy as cars, distribute_lib, collective_util, cross_device_ops as cdo
from tensorflow.python.distribute.cluster_resolver import SimpleClusterResolver
cpu = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpu[0], [tf.config.LogicalDeviceConfiguration()] * 2)
cluster = tf.train.ClusterSpec({"worker": [f"127.0.0.1:{p}" for p in PORTS]})
if MODE == "stock":
  import json
  os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster.as_dict(), "task": {"type": "worker", "index": TASK}})
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  log("stock MWMS constructed")
# --- the helper: enable collectives without MWMS (args identical to what MWMS passes) ---
context.context().configure_collective_ops(collective_leader="/job:worker/replica:0/task:0",
    scoped_allocator_enabled_ops=("CollectiveReduce",), device_filters=(f"/job:worker/task:{TASK}",))
sd = tensorflow_server_pb2.ServerDef(cluster=cluster.as_cluster_def(), default_session_config=copy.deepcopy(context.context().config),
    job_name="worker", task_index=TASK, protocol="grpc", port=PORTS[TASK])
if MODE != "stock":
  context.context().enable_collective_ops(sd); context.context().ensure_initialized()
W = f"/job:worker/replica:0/task:{TASK}"
LOCAL = [f"{W}/device:CPU:{i}" for i in range(2)]
calls = {}
def count(obj, name):
  f = getattr(obj, name)
  def g(*a, **k):
    calls[name] = calls.get(name, 0) + 1; return f(*a, **k)
  setattr(obj, name, g)

if MODE in ("sub", "submiss"):
  class Ext(cars.CollectiveAllReduceExtended):
    _std_server_started = True      # we started the server ourselves
    _enable_check_health = False    # no unbounded barrier / health thread
    def _initialize_local_devices(self, cluster_resolver, worker_device):
      return tuple(f"{worker_device}/device:CPU:{i}" for i in range(2)), "CPU"
  class MyMWMS(tf.distribute.MultiWorkerMirroredStrategy):
    def reduce(self, reduce_op, value, axis):
      # Keras 3 trainer._maybe_symbolic_build calls strategy.reduce("MEAN", (x, y), axis=None) on a tuple
      from tensorflow.python.util import nest
      if nest.is_nested(value):
        return nest.map_structure(lambda v: tf.distribute.MultiWorkerMirroredStrategy.reduce(self, reduce_op, v, axis), value)
      # Keras 3 reduce_per_replica (trainer.py ~838) calls reduce("MEAN", v, axis=0) on scalar logs
      if axis is not None and all(getattr(t, "shape", None) is not None and t.shape.rank == 0 for t in self.experimental_local_results(value)):
        axis = None
      return super().reduce(reduce_op, value, axis)
    def __init__(self, cluster_resolver, communication_options=None):
      distribute_lib.Strategy.__init__(self, Ext(self, cluster_resolver=cluster_resolver,
          communication_options=communication_options or collective_util.Options()))
  t = time.time()
  strategy = MyMWMS(SimpleClusterResolver(cluster, task_type="worker", task_id=TASK, rpc_layer="grpc"),
                    communication_options=tf.distribute.experimental.CommunicationOptions(timeout_seconds=5))
  log(f"constructed in {time.time()-t:.2f}s; isinstance MWMS:", isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy))
  ops_obj = strategy.extended._cross_device_ops
if MODE == "submiss":
  log("peer missing; creating a variable under scope (MWMS broadcasts initial values, V1 op, no timeout)")
  t = time.time()
  try:
    if os.environ.get("SKIPVAR"): raise RuntimeError("skipped")
    with strategy.scope(): v = tf.Variable(1.0)
    log(f"variable created after {time.time()-t:.2f}s")
  except Exception as e:
    log(f"variable creation raised after {time.time()-t:.2f}s", type(e).__name__, str(e)[:200])
  t = time.time()
  try:
    r = strategy.run(tf.function(lambda: tf.distribute.get_replica_context().all_reduce("sum", 1.0)))
    log("all_reduce returned?!")
  except Exception as e:
    log(f"replica all_reduce raised after {time.time()-t:.2f}s", type(e).__name__, str(e)[:200])
  sys.exit(0)
elif MODE == "stock":
  ops_obj = strategy.extended._cross_device_ops
else:
  ops_obj = cdo.CollectiveAllReduce(devices=LOCAL, group_size=4, options=collective_util.Options())
  strategy = tf.distribute.MirroredStrategy(LOCAL, cross_device_ops=ops_obj)
for n in ("batch_reduce_implementation", "reduce_implementation", "_all_reduce", "_gather_implementation"):
  count(ops_obj, n)
log("num_replicas_in_sync", strategy.num_replicas_in_sync, "worker_devices", strategy.extended.worker_devices,
    "_num_between_graph_workers", ops_obj._num_between_graph_workers)

# replica-context all_reduce check
@tf.function
def step():
  ctx = tf.distribute.get_replica_context()
  v = tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0 + 10.0 * TASK
  return ctx.all_reduce("sum", v), ctx.all_reduce("mean", v)
s, m = strategy.run(step)
log("replica all_reduce sum", [float(t) for t in strategy.experimental_local_results(s)], "mean", [float(t) for t in strategy.experimental_local_results(m)])

N, GB = 32, 8
X = np.arange(N * 3, dtype=np.float32).reshape(N, 3) / 50.0
Y = (X @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.3).astype(np.float32)
def mk():
  mdl = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, kernel_initializer="zeros")])
  mdl.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse"); return mdl
with strategy.scope():
  model = mk()
ds = tf.data.Dataset.from_tensor_slices((X, Y)).batch(GB)
try:
  h = model.fit(ds, epochs=2, verbose=0)
  wd = [v.numpy() for v in model.weights]
  per_rep = [[float(np.ravel(t.numpy())[0]) for t in strategy.experimental_local_results(v)] for v in model.weights]
  log("fit ok; losses", [round(l, 5) for l in h.history["loss"]], "kernel", np.ravel(wd[0]).round(5).tolist(), "bias", np.ravel(wd[1]).round(5).tolist(), "first elem per replica", per_rep)
except Exception as e:
  import traceback; traceback.print_exc(); log("fit raised", type(e).__name__, str(e)[:500])
ref = mk(); ref.fit(tf.data.Dataset.from_tensor_slices((X, Y)).batch(GB), epochs=2, verbose=0)
log("single-process reference kernel", np.ravel(ref.weights[0].numpy()).round(5).tolist(), "bias", np.ravel(ref.weights[1].numpy()).round(5).tolist())
log("calls to our cross-device ops object:", calls)
