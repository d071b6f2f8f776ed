"""Which engine replica takes a request: Ray Serve's request-router interface, with a policy
that keeps a conversation where its prefix is cached.

A request with an affinity key (asgi_call.affinity_key: a chat's opening messages, a prompt's
head) ranks first the replica that rendezvous hashing gives the key: the same replica for
every turn of a chat while the set of replicas stays, and only the keys of a replica that
leaves move. Ray Serve takes a rank's replica if it has room (fewer than
max_ongoing_requests in flight) and otherwise the least loaded of the next rank: here all
the others. Requests without a key form one rank: the least loaded replica.
"""

from __future__ import annotations

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from server.replicas.affinity import rendezvous_order


def affinity_of(pending: PendingRequest | None) -> str | None:
    """The affinity key of the HttpCall among the request's arguments, if any."""
    if pending is None:
        return None
    for arg in pending.args or ():
        key = getattr(arg, "affinity", None)
        if isinstance(key, str):
            return key
    return None


class AffinityRouter(RequestRouter):
    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        key = affinity_of(pending_request)
        if key is None or len(candidate_replicas) < 2:
            return [list(candidate_replicas)]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        order = rendezvous_order(key, list(by_id))
        return [[by_id[order[0]]], [by_id[rid] for rid in order[1:]]]
