"""The training side of tests/frameworks/test_tf_data_service_client.py: Horovod's data-service client API.

argv: MODE CONFIG.json.
"example" (under mpiexec, beside a compute job): each rank reads its share through the service; rank 0 ends as
Horovod's examples/tensorflow2/tensorflow2_mnist_data_service.py does, with
``compute_config.compute_client(verbose=2).shutdown()``, and prints "shut down" once that returned.
"thread" (under mpiexec): the compute job is ``compute_worker.main(dispatchers, dispatcher_side, configfile,
timeout)`` in a thread of each rank (started after hvd.init()), as Horovod's test_compute_worker.py runs it; the
main thread reads through the service, shuts the job down and joins the thread (bounded), printing what main
returned.
"""

import sys
import threading

import tensorflow as tf

import hpcvod.tensorflow as hvd
from hpcvod.tensorflow.data.compute_service import TfDataServiceConfig
from hpcvod.tensorflow.data.compute_worker import main

mode, config_path = sys.argv[1], sys.argv[2]
returned: list[object] = []
hvd.init()                     # before the thread, as in Horovod's test (main's init then finds it done)
rank, size = hvd.rank(), hvd.size()
if mode == "thread":
    worker = threading.Thread(target=lambda: returned.append(main(1, "compute", config_path, 20)), daemon=True)
    worker.start()
compute_config = TfDataServiceConfig.read(config_path, wait_for_file_creation=True, timeout=120)
dataset = tf.data.Dataset.range(40).map(lambda x: x * 3)
seen = [int(x) for x in dataset.send_to_data_service(compute_config, rank, size, reuse_dataset=True)]
everyone = sorted(sum(hvd.allgather_object(seen), []))
assert everyone == [3 * i for i in range(40)], everyone
if rank == 0:
    compute_config.compute_client(verbose=2).shutdown()
    print("shut down", flush=True)
if mode == "thread":
    worker.join(60)
    print(f"compute thread alive={worker.is_alive()} returned={returned}", flush=True)
