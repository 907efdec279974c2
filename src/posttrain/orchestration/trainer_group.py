"""The sharded trainer's ranks behind the single trainer actor's interface: `group.train_step.remote(batch)` and
the rest call every rank (each does its share; the collectives need all of them) and return one ObjectRef that
resolves to rank 0's result once every rank has finished, or raises the first rank's error. So the loop keeps
calling `roles.trainer.<method>.remote(...)` whether the trainer is one actor or N ranks."""

from __future__ import annotations

from typing import Any, Callable

from posttrain.config import RunConfig

class RankCall:
    """One method of the group, called like an actor method: `.remote(*args)` -> ObjectRef of rank 0's result."""

    def __init__(self, ranks: list, method: str):
        self.ranks, self.method = ranks, method

    def remote(self, *args, **kwargs):
        import ray

        # Each argument goes to the object store once, not once per rank.
        args = [a if isinstance(a, ray.ObjectRef) else ray.put(a) for a in args]
        refs = [getattr(rank, self.method).remote(*args, **kwargs) for rank in self.ranks]
        return _rank0_result.remote(*refs)


class TrainerGroup:
    """N ShardedTrainer actors (rank r = ranks[r]) in one torch.distributed group. Any trainer method is called on
    every rank (`group.train_step`, `group.save`, ... and methods added to Trainer later), in the same order on
    each rank, which is what keeps their collectives paired: call the group from one thread."""

    def __init__(self, ranks: list):
        self.ranks = ranks

    def __getattr__(self, method: str) -> RankCall:
        if method.startswith("_"):
            raise AttributeError(method)
        return RankCall(self.ranks, method)

    def each(self, method: str, *args) -> list:
        """Every rank's own result (not only rank 0's), e.g. `group.each("where")`."""
        import ray

        return ray.get([getattr(rank, method).remote(*args) for rank in self.ranks])


def create_trainer_group(cfg: RunConfig, model_dir: str, options_for_rank: Callable[[int], dict]) -> TrainerGroup:
    """Starts topology.trainer_ranks ranks, each on the slot `options_for_rank(r)` gives (the plan's bundles), then
    lets rank 0 pick the rendezvous address (127.0.0.1 on one node, its node's address across nodes) and a free
    port, and forms the group (every rank joins at once; loading and sharding the policy happen there)."""
    import ray

    from posttrain.training.distributed import ShardedTrainer

    n = cfg.topology.trainer_ranks
    cfg_dict = cfg.to_dict()
    ranks = [ray.remote(ShardedTrainer).options(**options_for_rank(r)).remote(cfg_dict, model_dir, r, n)
             for r in range(n)]
    host, port = ray.get(ranks[0].rendezvous_address.remote())
    ray.get([rank.join.remote(host, port) for rank in ranks])
    return TrainerGroup(ranks)


def _first(first: Any, *_others: Any) -> Any:
    return first


def _remote_first():
    import ray

    return ray.remote(num_cpus=0)(_first)


class _LazyRemote:
    """`ray.remote` needs Ray imported; build the task on first use so importing this module stays cheap."""

    task = None

    def remote(self, *refs):
        if self.task is None:
            type(self).task = _remote_first()
        return self.task.remote(*refs)


_rank0_result = _LazyRemote()
