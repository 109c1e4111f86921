"""The Flower side of benchmarks/flower.py: a ClientApp training McMahan's CNN on one share.

Written against Flower's own Message API (flwr 1.41), independent of clusterfed's runtime.
Each Ray actor builds the federation once (the same iid split as the clusterfed side) and
keeps it; training is the textbook PyTorch loop: SGD, 1 local epoch, the config's batch size.
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clusterfed.data import build_federation
from clusterfed.models import build_model

app = ClientApp()


@lru_cache(maxsize=1)
def federation(clients: int, per_client: int, seed: int):
    from common import mnist  # benchmarks/ is on this worker's PYTHONPATH
    dataset, _ = mnist()
    return build_federation(dataset, {"kind": "iid", "clients": clients,
                                      "samples_per_client": per_client,
                                      "test_samples_per_client": 1}, seed)


@app.train()
def train(msg: Message, context: Context) -> Message:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    config = msg.content["config"]
    fed = federation(int(config["clients"]), int(config["per-client"]), int(config["seed"]))
    data = fed.clients[int(context.node_config["partition-id"])]
    x, y = torch.from_numpy(data.train_x), torch.from_numpy(data.train_y)
    model = build_model("fedavg_cnn", fed.input_shape, fed.n_classes)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    from common import textbook_epoch
    textbook_epoch(model, torch.optim.SGD(model.parameters(), lr=float(config["lr"])), x, y,
                   int(config["batch-size"]))
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"num-examples": len(y)})})
    return Message(content=content, reply_to=msg)
