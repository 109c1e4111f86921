"""The Flower ClientApp: runs the simulator's client tasks on the node's own client.

Three message types (see `wire`): `query.hello` (which client this node serves and what its
data is like), `query.initial` (the initial model in the clients' P-space, for a server that
does not hold the privacy secret) and `train.task` (any ClientTask, evaluation included). An
exception here becomes Flower's error reply; the server logs it as a missing client. """

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from clusterfed.client.runtime import keeps_optimizer_state
from clusterfed.flower import wire
from clusterfed.flower.cost import message_cost
from clusterfed.flower.node import hello_facts, node_for

app = ClientApp(mods=[message_cost])   # logs each message's cost when asked (flower/cost.py)


@app.query("hello")
def hello(msg: Message, context: Context) -> Message:
    config_json = str(msg.content.config_records[wire.RUN]["config"])
    facts = hello_facts(config_json, context.node_config)
    return Message(RecordDict({wire.FIELDS: ConfigRecord(facts)}), reply_to=msg)


@app.query("initial")
def initial(msg: Message, context: Context) -> Message:
    index, config_json = wire.decode_initial(msg.content)
    vector = node_for(config_json, context.node_config).initial(index)
    return Message(wire.encode_vector(vector), reply_to=msg)


@app.train("task")
def task(msg: Message, context: Context) -> Message:
    task, round_index, step, config_json = wire.decode_task(msg.content)
    node = node_for(config_json, context.node_config)
    kept = keeps_optimizer_state(task)
    if kept:   # the client's optimiser continues from its last task (train.optimizer_state)
        node.set_optimizer_state(wire.read_optimizer_state(context.state))
    result = node.run(task, round_index, step, wire.addressed_partition(msg.content))
    if kept:
        wire.write_optimizer_state(context.state, node.optimizer_state())
    return Message(wire.encode_result(result), reply_to=msg)
