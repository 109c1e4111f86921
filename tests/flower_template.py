"""A Flower app written the way Flower's PyTorch quickstart and `flwr new` template write one,
from Flower's message convention alone (no clusterfed code): the user's app the strategies of
`clusterfed.flower.strategies` must serve unmodified.

Data: scikit-learn's digits, split evenly over `num-partitions` clients; the clients form
`groups` groups (node config, default four; partition p in group p % groups), group g's digits
have labels 2g and 2g + 1 swapped (a label-swap federation; one group is iid), or with node
config `shift = "labels"` group g holds the digits d with d % groups == g (label groups). The
test set of each client is the last fifth of its share.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

GROUPS = 4


class Net(nn.Module):
    """A small MLP for 8x8 digits."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def true_group(partition_id: int, groups: int = GROUPS) -> int:
    return partition_id % groups


def load_data(partition_id: int, num_partitions: int, groups: int = GROUPS,
              shift: str = "swap") -> tuple[DataLoader, DataLoader]:
    """This partition's train and test loaders. `shift`: "swap" (group g swaps labels 2g and
    2g + 1) or "labels" (group g holds the digits d with d % groups == g)."""
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    g = true_group(partition_id, groups)
    if shift == "labels":
        members = range(g, num_partitions, groups)
        share = np.array_split(order[y[order] % groups == g], len(members))[partition_id // groups]
    else:
        share = np.array_split(order, num_partitions)[partition_id]
    labels = y[share].copy()
    if groups > 1 and shift == "swap":
        a, b = labels == 2 * g, labels == 2 * g + 1
        labels[a], labels[b] = 2 * g + 1, 2 * g
    data = torch.tensor(x[share] / 16.0, dtype=torch.float32)
    target = torch.tensor(labels, dtype=torch.long)
    cut = len(share) * 4 // 5
    train = TensorDataset(data[:cut], target[:cut])
    test = TensorDataset(data[cut:], target[cut:])
    return (DataLoader(train, batch_size=16, shuffle=True,
                       generator=torch.Generator().manual_seed(partition_id)),
            DataLoader(test, batch_size=64))


def partition_data(context: Context) -> tuple[DataLoader, DataLoader]:
    """The loaders of the partition a node's config names."""
    node = context.node_config
    return load_data(node["partition-id"], node["num-partitions"], node.get("groups", GROUPS),
                     node.get("shift", "swap"))


def train(net: Net, trainloader: DataLoader, epochs: int, lr: float) -> float:
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for images, labels in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net: Net, testloader: DataLoader) -> tuple[float, float]:
    criterion = nn.CrossEntropyLoss()
    net.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for images, labels in testloader:
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (outputs.argmax(1) == labels).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)


app = ClientApp()


@app.train()
def train_handler(msg: Message, context: Context) -> Message:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    trainloader, _ = partition_data(context)
    train_loss = train(model, trainloader, context.run_config["local-epochs"],
                       msg.content["config"]["lr"])
    model_record = ArrayRecord(model.state_dict())
    metrics = {"train_loss": train_loss, "num-examples": len(trainloader.dataset)}
    content = RecordDict({"arrays": model_record, "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate_handler(msg: Message, context: Context) -> Message:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, testloader = partition_data(context)
    eval_loss, eval_acc = test(model, testloader)
    metrics = {"eval_loss": eval_loss, "eval_acc": eval_acc,
               "num-examples": len(testloader.dataset)}
    content = RecordDict({"metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)
