"""CFL's parameter tree (Section V-C) as pure functions of the state: a leaf replaced by its
two children, a newcomer routed down one level (Algorithm 4) and joining a leaf, clients
leaving, and the models on a client's root-to-leaf path. A change of a leaf's members drops
its per-member records (`memory.py`, `cache.py`), whose rows would no longer match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from clusterfed.algorithms.aggregate import cluster_fedavg
from clusterfed.algorithms.cfl import maths as cfl_math
from clusterfed.clustering.similarity import cosine_similarity_matrix

if TYPE_CHECKING:
    from clusterfed.algorithms.cfl.algorithm import CFLState


def leaf_index(state: CFLState, node: int) -> int:
    """The position of leaf `node` among the state's leaves (and its model's row)."""
    return int(np.flatnonzero(state.leaves == node)[0])


def split_leaf(state: CFLState, leaf: int, parts: tuple[np.ndarray, np.ndarray],
               updates: np.ndarray, weights: np.ndarray, rnd: int, *, restart: bool
               ) -> CFLState:
    """Replace a leaf by its two children; positions in `parts` index `updates` and members."""
    from clusterfed.algorithms.cfl.algorithm import Node  # the state's module imports this one

    state = _forget_records(state, [leaf])
    k = leaf_index(state, leaf)
    parent_model = state.models[k]
    members = state.nodes[leaf].members
    nodes = list(state.nodes)
    child_models = np.repeat(parent_model[None], len(parts), axis=0)
    if not restart:
        rows = np.concatenate(parts)
        side = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
        child_models = cluster_fedavg(child_models, updates[rows], side, weights[rows])
    child_ids = []
    for part in parts:
        # Map sub-matrix positions back to client ids (the authors' code gets this wrong).
        child_members = np.sort(cfl_math.map_to_clients(members, part))
        child_ids.append(len(nodes))
        nodes.append(Node(members=child_members, parent=leaf,
                          edge_updates=updates[part].astype(np.float32)))
    nodes[leaf] = replace(nodes[leaf], children=tuple(child_ids), split_round=rnd,
                          model=parent_model.copy())
    client_node = state.client_node.copy()
    for cid, node in zip(child_ids, nodes[-2:], strict=True):
        client_node[node.members] = cid
    keep = np.arange(len(state.leaves)) != k
    return replace(
        state, nodes=tuple(nodes),
        max_norms={v: h for v, h in state.max_norms.items() if v != leaf},
        streaks={v: s for v, s in state.streaks.items() if v != leaf},
        leaves=np.concatenate([state.leaves[keep], child_ids]),
        models=np.concatenate([state.models[keep], np.stack(child_models)]).astype(np.float32),
        client_node=client_node,
        last_split=np.concatenate([state.last_split[keep], [rnd, rnd]]))


def route_one_level(state: CFLState, client: int, node: int, update: np.ndarray
                    ) -> tuple[CFLState, dict[str, Any]]:
    """Algorithm 4, one level: go to the child whose cached updates are most similar.

    The printed box compares against Delta_(v->v1) and Delta_(v->v2); the intended edges are
    the node's two children (spec 2.4). Ties go to the second child, as in the box.
    """
    v0, v1 = state.nodes[node].children
    a0, a1 = (float(cosine_similarity_matrix(
        np.concatenate([update[None], state.nodes[v].edge_updates]))[0, 1:].max())
        for v in (v0, v1))
    target = v0 if a0 > a1 else v1
    client_node = state.client_node.copy()
    client_node[client] = target
    state = replace(state, client_node=client_node)
    if not state.nodes[target].children:
        state = join_leaf(state, client, target)
    return state, {"type": "route", "client": client, "from": node, "to": target,
                   "alpha": [a0, a1], "joined": bool(state.joined[client])}


def join_leaf(state: CFLState, client: int, leaf: int) -> CFLState:
    """A routed client joins `leaf` and the member lists of all its ancestors."""
    state = _forget_records(state, [leaf])
    nodes = list(state.nodes)
    v = leaf
    while v >= 0:
        nodes[v] = replace(nodes[v], members=np.union1d(nodes[v].members, [client]))
        v = nodes[v].parent
    joined = state.joined.copy()
    joined[client] = True
    client_node = state.client_node.copy()
    client_node[client] = leaf
    return replace(state, nodes=tuple(nodes), joined=joined, client_node=client_node)


def remove_clients(state: CFLState, clients: Sequence[int]) -> CFLState:
    """Clients leave: they stop training and leave their leaf's member list (spec 2.8).

    Cached edge updates stay: they remain valid evidence for routing newcomers.
    """
    state = _forget_records(state, state.leaves.tolist())
    nodes = list(state.nodes)
    for leaf in state.leaves.tolist():
        nodes[leaf] = replace(nodes[leaf], members=np.setdiff1d(nodes[leaf].members, clients))
    joined = state.joined.copy()
    joined[list(clients)] = False
    return replace(state, nodes=tuple(nodes), joined=joined)


def path_models(state: CFLState, client: int) -> list[np.ndarray]:
    """The models on a client's root-to-leaf path, most general first (the FL model first)."""
    path = []
    v = int(state.client_node[client])
    while v >= 0:
        path.append(v)
        v = state.nodes[v].parent
    path.reverse()
    out = [state.nodes[v].model for v in path[:-1]]
    leaf = path[-1]
    out.append(state.models[leaf_index(state, leaf)] if leaf in state.leaves
               else state.nodes[leaf].model)
    return out


def _forget_records(state: CFLState, leaves: Sequence[int]) -> CFLState:
    """Drop the per-member records (averaged similarities, latest updates) of leaves whose
    members change: their rows would not match."""
    def keep(records: dict[int, Any]) -> dict[int, Any]:
        return {v: x for v, x in records.items() if v not in leaves}
    return replace(state, similarities=keep(state.similarities),
                   similarity_rounds=keep(state.similarity_rounds),
                   latest_updates=keep(state.latest_updates),
                   latest_rounds=keep(state.latest_rounds),
                   latest_samples=keep(state.latest_samples),
                   latest_grams=keep(state.latest_grams),
                   accepted_sides=keep(state.accepted_sides),
                   accepted_count=keep(state.accepted_count))
