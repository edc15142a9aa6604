"""The seeds' "TensorFlow v1 Example" (Horovod's usage docs), adapted only by ``tf.compat.v1``, on the digits.

Run: ``hpcvod run -np 2 python examples/tensorflow1_digits.py`` (or submit it). Graph mode: a
``tf.compat.v1.train.AdagradOptimizer`` wrapped in ``hvd.DistributedOptimizer``, ``hvd.BroadcastGlobalVariablesHook(0)``
and a ``MonitoredTrainingSession`` that writes checkpoints on rank 0 only. Each rank trains on its own shard.
"""

import os
import sys
import tempfile

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import hpcvod.tensorflow as hvd

tf.compat.v1.disable_eager_execution()

STEPS = int(os.environ.get("TF1_DIGITS_STEPS", "300"))
BATCH = 32

# Initialize Horovod
hvd.init()

# Pin GPU to be used to process local rank (one GPU per process)
config = tf.compat.v1.ConfigProto()
config.gpu_options.visible_device_list = str(hvd.local_rank())

# Data: every rank its own shard of the training digits, the last 297 digits held out.
digits = load_digits()
x_all = (digits.data / 16.0).astype(np.float32)
y_all = digits.target.astype(np.int64)
x_train, y_train = x_all[:1500][hvd.rank()::hvd.size()], y_all[:1500][hvd.rank()::hvd.size()]
x_test, y_test = x_all[1500:], y_all[1500:]

# Build model...
images = tf.compat.v1.placeholder(tf.float32, [None, 64])
labels = tf.compat.v1.placeholder(tf.int64, [None])


def dense(x, units, name):
    """A dense layer from plain variables (tf.compat.v1.layers needs Keras 2); random initial values differ per
    rank until the broadcast hook runs."""
    w = tf.compat.v1.get_variable(f"{name}/kernel", [x.shape[1], units],
                                  initializer=tf.compat.v1.glorot_uniform_initializer())
    b = tf.compat.v1.get_variable(f"{name}/bias", [units], initializer=tf.compat.v1.zeros_initializer())
    return tf.matmul(x, w) + b


hidden = tf.nn.relu(dense(images, 64, "hidden"))
logits = dense(hidden, 10, "logits")
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))
global_step = tf.compat.v1.train.get_or_create_global_step()

opt = tf.compat.v1.train.AdagradOptimizer(0.01 * hvd.size())

# Add Horovod Distributed Optimizer
opt = hvd.DistributedOptimizer(opt)

# Add hook to broadcast variables from rank 0 to all other processes during initialization.
hooks = [hvd.BroadcastGlobalVariablesHook(0), tf.compat.v1.train.StopAtStepHook(last_step=STEPS)]

# Make training operation
train_op = opt.minimize(loss, global_step=global_step)

# Save checkpoints only on worker 0 to prevent other workers from corrupting them.
checkpoint_dir = (os.environ.get("TF1_DIGITS_CHECKPOINT_DIR") or tempfile.mkdtemp(prefix="tf1_digits_")) \
    if hvd.rank() == 0 else None

# The MonitoredTrainingSession takes care of session initialization, restoring from a checkpoint, saving to a
# checkpoint, and closing when done or an error occurs.
rng = np.random.default_rng(hvd.rank())
with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, config=config,
                                                 hooks=hooks) as mon_sess:
    while not mon_sess.should_stop():
        # Perform synchronous training.
        batch = rng.integers(0, len(x_train), BATCH)
        mon_sess.run(train_op, feed_dict={images: x_train[batch], labels: y_train[batch]})
        if mon_sess.should_stop():
            break
    # (MonitoredSession stops right after the last step; evaluate with a plain session below.)

with tf.compat.v1.Session(config=config) as sess:
    saver = tf.compat.v1.train.Saver()
    if hvd.rank() == 0:
        saver.restore(sess, tf.train.latest_checkpoint(checkpoint_dir))
    else:
        sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(hvd.broadcast_global_variables(0))
    acc = sess.run(accuracy, feed_dict={images: x_test, labels: y_test})
if hvd.rank() == 0:
    print(f"test accuracy {acc:.4f} after {STEPS} steps on {hvd.size()} ranks", flush=True)
    sys.exit(0 if acc > 0.8 else 1)
