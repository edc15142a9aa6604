"""The training side of the tf.data service tests (tests/frameworks/test_tf_data_service.py), under mpiexec.

argv: CONFIG.json MODE OUT.json. MODE: "shared" (one compute-side dispatcher, distributed_epoch with a shared job:
every element reaches one rank once), "per-rank" (dispatcher_side=training, one dispatcher per rank: each rank
gets the whole dataset), "partial" (as "per-rank", but each rank reads 5 elements of a long dataset and leaves
the block with its iteration unfinished: the compute workers' tasks are still busy when the dispatcher stops),
"forever" (keep reading a repeated dataset: the compute job gets killed meanwhile).
Each rank writes the elements it saw; rank 0 calls config.shutdown() at the end.
"""

import json
import sys

import tensorflow as tf

import hpcvod.tensorflow as hvd
from hpcvod.tensorflow.data.compute_service import TfDataServiceConfig, tf_data_service

hvd.init()
rank, size = hvd.rank(), hvd.size()
config_path, mode, out = sys.argv[1], sys.argv[2], sys.argv[3]
config = TfDataServiceConfig.read(config_path, wait_for_file_creation=True, timeout=120)
# the heavy map runs in the service: pure TF ops only (docs/measured.md)
dataset = tf.data.Dataset.range(200).map(lambda x: x * 3)
if mode == "shared":
    seen = [int(x) for x in dataset.send_to_data_service(config, rank, size, reuse_dataset=True)]
elif mode == "per-rank":
    with tf_data_service(config, rank) as address:
        distributed = dataset.apply(tf.data.experimental.service.distribute(
            processing_mode="distributed_epoch", service=address))
        seen = [int(x) for x in distributed]
elif mode == "partial":
    with tf_data_service(config, rank) as address:
        distributed = dataset.repeat(10**6).apply(tf.data.experimental.service.distribute(
            processing_mode="distributed_epoch", service=address))
        reading = iter(distributed)
        seen = [int(next(reading)) for _ in range(5)]
else:
    print(f"rank {rank} reading for ever", flush=True)
    for _ in dataset.repeat().send_to_data_service(config, rank, size, reuse_dataset=True):
        pass
everyone = hvd.allgather_object(seen)
if rank == 0:
    with open(out, "w") as f:
        json.dump(everyone, f)
    config.shutdown()
hvd.barrier()
print(f"rank {rank} consumed {len(seen)}", flush=True)
