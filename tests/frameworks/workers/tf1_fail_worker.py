"""A rank that fails inside session.run (TF v1 graph mode), under ``mpiexec -n 2``: rank 1's assertion op fails in
step 3, before its gradients reach the allreduce that rank 0 is already waiting in. The job must end with an
error on every rank, never a hang."""

import numpy as np
import tensorflow as tf

import hpcvod.tensorflow as hvd

tf.compat.v1.disable_eager_execution()
hvd.init()
x = tf.compat.v1.placeholder(tf.float32, [None, 3])
healthy = tf.compat.v1.placeholder(tf.bool, [])
w = tf.compat.v1.get_variable("w", initializer=np.ones(3, np.float32))
with tf.control_dependencies([tf.debugging.Assert(healthy, ["injected failure inside session.run"])]):
    loss = tf.reduce_sum(tf.linalg.matvec(x, w))
train_op = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1)).minimize(loss)
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(hvd.broadcast_global_variables(0))
    for step in range(6):
        sess.run(train_op, feed_dict={x: np.ones((2, 3), np.float32), healthy: not (hvd.rank() == 1 and step == 3)})
        print(f"rank {hvd.rank()} finished step {step}", flush=True)
print(f"rank {hvd.rank()} TRAINED TO THE END", flush=True)
