"""The Flower runtime: any registered algorithm over a real network, unchanged.

- `server_app.app`: a ServerApp running the simulator's round loop with a `FlowerExecutor`.
- `client_app.app`: a ClientApp running the simulator's client tasks on the node's own client.
- `executor.FlowerExecutor`: the `Executor` protocol over a Flower Grid.
- `wire`: ClientTask / ClientResult <-> Flower records.
- `local.LocalFederation`: a SuperLink and N SuperNodes on 127.0.0.1 (`clusterfed flower local`).

Needs `pip install 'clusterfed[flower]'`; see docs/flower.md.
"""
