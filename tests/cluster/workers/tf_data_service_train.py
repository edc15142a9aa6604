"""The training side of a `hpcvod submit --data-service-nodes` job on the Slurm test cluster
(tests/cluster/test_slurm_data_service.py): finds the compute job through HPCVOD_DATA_SERVICE_CONFIG, reads a
finite dataset with distributed_epoch (every element reaches one rank once), writes what each rank saw.

argv: OUT.json [forever]. "forever": keep reading a repeated dataset (the test kills the compute job meanwhile);
otherwise rank 0 tells the compute job to stop when done.
"""

import json
import os
import sys

import tensorflow as tf

import hpcvod.tensorflow as hvd
from hpcvod.tensorflow.data.compute_service import TfDataServiceConfig

hvd.init()
rank, size = hvd.rank(), hvd.size()
out = sys.argv[1]
forever = sys.argv[2:] == ["forever"]
config = TfDataServiceConfig.read(os.environ["HPCVOD_DATA_SERVICE_CONFIG"], wait_for_file_creation=True, timeout=120)
dataset = tf.data.Dataset.range(300).map(lambda x: x * 3)  # runs in the compute job: pure TF ops only
if forever:
    print(f"rank {rank} reading for ever", flush=True)
    for _ in dataset.repeat().send_to_data_service(config, rank, size, reuse_dataset=True):
        pass
seen = [int(x) for x in dataset.send_to_data_service(config, rank, size, reuse_dataset=True)]
everyone = hvd.allgather_object({"host": os.uname().nodename, "seen": seen})
if rank == 0:
    with open(out, "w") as f:
        json.dump(everyone, f)
    config.shutdown()
print(f"rank {rank} on {os.uname().nodename} consumed {len(seen)}", flush=True)
