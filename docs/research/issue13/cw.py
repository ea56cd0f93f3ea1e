"""Collective worker probe. usage: cw.py MODE TASK PORT0 PORT1 [TIMEOUT]
Enables collectives WITHOUT MultiWorkerMirroredStrategy and runs *_v2 collective ops."""
import os, sys, time, copy, signal
T0 = time.time()
def log(*a): print(f"[t{TASK} {time.time()-T0:6.2f}s]", *a, flush=True)
MODE, TASK = sys.argv[1], int(sys.argv[2]); PORTS = [int(sys.argv[3]), int(sys.argv[4])]
TO = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
os.environ.pop("TF_CONFIG", None)
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.core.protobuf import tensorflow_server_pb2
from tensorflow.python.ops import collective_ops as C
log("imported")
if os.environ.get("INTEROP"): tf.config.threading.set_inter_op_parallelism_threads(int(os.environ["INTEROP"]))
cpu = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpu[0], [tf.config.LogicalDeviceConfiguration()] * 2)
cluster = tf.train.ClusterSpec({"worker": [f"127.0.0.1:{p}" for p in PORTS]})
me = f"/job:worker/replica:0/task:{TASK}"
context.context().configure_collective_ops(
    collective_leader="/job:worker/replica:0/task:0",
    scoped_allocator_enabled_ops=("CollectiveReduce",),
    device_filters=None if os.environ.get("NOFILTER") else (f"/job:worker/task:{TASK}",))
if os.environ.get("COORD"):
  from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2 as cc
  log("configuring coordination service like MWMS, cluster_register_timeout_in_ms=", os.environ.get("REGMS", "0"))
  context.context().configure_coordination_service(service_type="standalone", service_leader="/job:worker/replica:0/task:0",
      coordinated_jobs=[cc.CoordinatedJob(name="worker", num_tasks=2)], cluster_register_timeout_in_ms=int(os.environ.get("REGMS", "0")))
cfg = copy.deepcopy(context.context().config)
sd = tensorflow_server_pb2.ServerDef(cluster=cluster.as_cluster_def(), default_session_config=cfg,
                                     job_name="worker", task_index=TASK, protocol="grpc", port=PORTS[TASK])
context.context().enable_collective_ops(sd)
log("enable_collective_ops returned")
context.context().ensure_initialized()
log("ensure_initialized returned; devices:", [d.name for d in tf.config.list_logical_devices()])
D0, D1 = me + "/device:CPU:0", me + "/device:CPU:1"

@tf.function
def one_per_worker(x):
  with tf.device(D0):
    s = C.all_reduce_v2(x, 2, group_key=1, instance_key=1, communication_hint="ring", timeout=TO)
    m = C.all_reduce_v2(x, 2, group_key=1, instance_key=2, merge_op="Add", final_op="Div", communication_hint="ring", timeout=TO)
    g = C.all_gather_v2(x, 2, group_key=1, instance_key=3, communication_hint="ring", timeout=TO)
    if TASK == 0:
      b = C.broadcast_send_v2(x, 2, group_key=1, instance_key=4, communication_hint="ring", timeout=TO)
    else:
      b = C.broadcast_recv_v2(tf.shape(x), x.dtype, 2, group_key=1, instance_key=4, communication_hint="ring", timeout=TO)
  return s, m, g, b

@tf.function
def all_four(x):
  outs = []
  for i, d in enumerate([D0, D1]):
    with tf.device(d):
      xi = tf.identity(x) + float(i)
      outs.append(C.all_reduce_v2(xi, 4, group_key=2, instance_key=10, communication_hint="ring", timeout=TO))
      outs.append(C.all_gather_v2(xi, 4, group_key=2, instance_key=11, communication_hint="ring", timeout=TO))
  return outs

x = tf.constant([1.0 + 10 * TASK, 2.0 + 10 * TASK])
if MODE == "basic":
  for k, v in zip("smgb", one_per_worker(x)): log("1/worker", k, v.numpy().tolist(), v.device)
  for v in all_four(x): log("4 devs", v.numpy().tolist(), v.device)
  log("done")
elif MODE == "fourtok":
  toks = []
  for d in [D0, D1]:
    with tf.device(d): toks.append(tf.Variable(0.0))
  @tf.function
  def fourtok(x):
    outs = []
    for i, d in enumerate([D0, D1]):
      with tf.device(d):
        xi = tf.identity(x) + float(i)
        outs.append(C.all_reduce_v2(xi, 4, group_key=3, instance_key=20, communication_hint="ring", timeout=TO, ordering_token=toks[i].handle))
        outs.append(C.all_gather_v2(xi, 4, group_key=3, instance_key=21, communication_hint="ring", timeout=TO, ordering_token=toks[i].handle))
        outs.append(C.all_reduce_v2(xi, 4, group_key=3, instance_key=22, merge_op="Add", final_op="Div", communication_hint="ring", timeout=TO, ordering_token=toks[i].handle))
    return outs
  for _ in range(2):
    for v in fourtok(x): log("4 devs w/ ordering_token", v.numpy().tolist(), v.device)
  log("done")
elif MODE == "four":
  @tf.function
  def four(x):
    outs = []
    for i, d in enumerate([D0, D1]):
      with tf.device(d):
        outs.append(C.all_reduce_v2(tf.identity(x) + float(i), 4, group_key=3, instance_key=20, communication_hint="ring", timeout=TO))
    return outs
  for v in four(x): log("4 devs reduce only", v.numpy().tolist(), v.device)
  for v in all_four(x): log("4 devs", v.numpy().tolist(), v.device)
  log("done")
elif MODE == "health":
  peer = "/job:worker/replica:0/task:%d" % (1 - TASK)
  for tmo in (2000, 0):
    t = time.time()
    try:
      context.context().check_collective_ops_peer_health(peer, timeout_in_ms=tmo); log("peer healthy")
    except Exception as e:
      log(f"check_collective_ops_peer_health({peer}, {tmo}ms) raised after {time.time()-t:.2f}s:", type(e).__name__, str(e)[:300])
elif MODE == "killbig":
  import threading
  one_per_worker(x); log("first collective ok")
  big = tf.ones([int(os.environ.get("NELEM", "25000000"))])
  if os.environ.get("WATCH") and TASK == 0:
    def watch():
      peer = "/job:worker/replica:0/task:1"
      while True:
        try:
          context.context().check_collective_ops_peer_health(peer, timeout_in_ms=1000)
        except Exception as e:
          log("watchdog: peer down:", type(e).__name__, str(e)[:150])
          context.context().abort_collective_ops(tf.errors.UNAVAILABLE, f"peer {peer} is down: {e}"[:300]); return
        time.sleep(0.5)
    threading.Thread(target=watch, daemon=True).start()
  if TASK == 1 and os.environ.get("KILLAT") == "before":
    time.sleep(1.0); log("SIGKILL self before joining"); os.kill(os.getpid(), signal.SIGKILL)
  if TASK == 1:
    threading.Timer(float(os.environ.get("KILLAT", "0.15")), lambda: (log("SIGKILL self mid-collective"), os.kill(os.getpid(), signal.SIGKILL))).start()
  @tf.function
  def bigred(x):
    with tf.device(D0):
      return C.all_reduce_v2(x, 2, group_key=1, instance_key=200, communication_hint="ring", timeout=TO)
  t = time.time()
  try:
    r = bigred(big); log(f"big collective finished after {time.time()-t:.2f}s (kill came too late)", float(r[0]))
  except Exception as e:
    log(f"big collective raised after {time.time()-t:.2f}s:", type(e).__name__, str(e)[:700])
elif MODE == "missing":
  log("calling collective with timeout", TO)
  t = time.time()
  try:
    one_per_worker(x); log("unexpected success")
  except Exception as e:
    log(f"raised after {time.time()-t:.2f}s:", type(e).__name__, str(e)[:600])
elif MODE in ("kill", "killmid"):
  import threading
  one_per_worker(x); log("first collective ok")
  if os.environ.get("WATCH") and TASK == 0:
    def watch():
      peer = "/job:worker/replica:0/task:1"
      while True:
        try:
          context.context().check_collective_ops_peer_health(peer, timeout_in_ms=1000)
        except Exception as e:
          log("watchdog: peer down:", type(e).__name__, str(e)[:150])
          context.context().abort_collective_ops(tf.errors.UNAVAILABLE, f"peer {peer} is down: {e}"[:300]); return
        time.sleep(0.5)
    threading.Thread(target=watch, daemon=True).start()
  if TASK == 1:
    if MODE == "kill":
      log("task1 SIGKILL self before 2nd collective"); os.kill(os.getpid(), signal.SIGKILL)
    else:
      time.sleep(1.0); log("task1 SIGKILL self after 1s while task0 waits"); os.kill(os.getpid(), signal.SIGKILL)
  t = time.time()
  try:
    @tf.function
    def second(x):
      with tf.device(D0):
        return C.all_reduce_v2(x, 2, group_key=1, instance_key=100, communication_hint="ring", timeout=TO)
    second(x); log("unexpected success")
  except Exception as e:
    log(f"2nd collective raised after {time.time()-t:.2f}s:", type(e).__name__, str(e)[:600])
