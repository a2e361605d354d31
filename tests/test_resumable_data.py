"""Resume is exact with DataLoader worker processes: the data position is what the loop consumed.

With ``num_workers > 0`` a DataLoader asks its sampler for ``num_workers × prefetch_factor``
batches ahead; a position taken from the sampler itself is past the step that was saved, and
a resume would skip those samples. ``ResumableLoader`` counts the batches the loop received.
"""

from __future__ import annotations

import pytest
from conftest import needs_torch

pytestmark = needs_torch


def loader_for(dataset_size: int, **kwargs: object) -> object:
    import torch

    from launchers.elastic import pytorch as ept

    dataset = torch.arange(dataset_size)
    sampler = ept.ResumableSampler(dataset, seed=7)
    return ept.ResumableLoader(torch.utils.data.DataLoader(dataset, sampler=sampler, **kwargs))


def batches(loader: object, count: int) -> list[list[int]]:
    from launchers.elastic import pytorch as ept

    assert isinstance(loader, ept.ResumableLoader)
    out: list[list[int]] = []
    while len(out) < count:
        for batch in loader:
            out.append(batch.tolist())
            if len(out) == count:
                break
    return out


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_workers": 0},
        {"num_workers": 2},
        {"num_workers": 2, "prefetch_factor": 5},
        {"num_workers": 1, "persistent_workers": True},
        {"num_workers": 2, "persistent_workers": True, "drop_last": True},
    ],
    ids=["0-workers", "2-workers", "prefetch-5", "persistent", "persistent-drop-last"],
)
@pytest.mark.parametrize("stop", [3, 9, 10], ids=["mid-epoch", "end-of-epoch", "next-epoch"])
def test_resume_continues_with_the_next_unseen_batch(kwargs: dict[str, object], stop: int) -> None:
    """38 samples in batches of 4: 9 full batches and 2 left over per epoch."""
    from launchers.elastic import pytorch as ept

    reference = batches(loader_for(38, batch_size=4, **kwargs), 24)
    first = loader_for(38, batch_size=4, **kwargs)
    assert batches(first, stop) == reference[:stop]
    snapshot = ept.capture(stop - 1, data=first)
    resumed = loader_for(38, batch_size=4, **kwargs)
    ept.restore(snapshot, data=resumed)
    assert batches(resumed, 24 - stop) == reference[stop:]


def test_the_sampler_alone_runs_ahead_with_workers_and_capturing_it_warns() -> None:
    """Why the wrapper exists: the sampler's own position counts prefetched indices too — and says so."""
    import torch

    from launchers.elastic import pytorch as ept

    dataset = torch.arange(64)
    sampler = ept.ResumableSampler(dataset, seed=7)
    loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    with pytest.warns(RuntimeWarning, match=r"iterated directly by a DataLoader with 2 worker.*ResumableLoader"):
        position = sampler.state_dict()["position"]
    assert position > 4  # 2 workers × prefetch 2 batches ahead
    del it


def test_no_warning_through_the_wrapper_or_without_workers(recwarn: pytest.WarningsRecorder) -> None:
    import torch

    from launchers.elastic import pytorch as ept

    dataset = torch.arange(64)
    wrapped = loader_for(64, batch_size=4, num_workers=2)
    assert isinstance(wrapped, ept.ResumableLoader)
    it = iter(wrapped)
    next(it)
    wrapped.state_dict()
    wrapped.sampler.state_dict()
    del it
    plain_sampler = ept.ResumableSampler(dataset, seed=7)
    it2 = iter(torch.utils.data.DataLoader(dataset, sampler=plain_sampler, batch_size=4))
    next(it2)
    assert plain_sampler.state_dict()["position"] == 4
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def _lockstep(samplers: list, steps: int, batch: int) -> list[int]:
    """What ``steps`` data-parallel steps consume: ``batch`` indices from every rank's sampler per step."""
    iters = [iter(s) for s in samplers]
    return [next(it) for _ in range(steps) for it in iters for _ in range(batch)]


@pytest.mark.parametrize(("before", "after"), [(4, 2), (2, 4), (4, 3), (3, 2)])
def test_another_world_size_continues_the_epoch_without_skip_or_repeat(before: int, after: int) -> None:
    """Ranks in lockstep consumed a prefix of the epoch's permutation; the new ranks share out the rest."""
    from launchers.elastic import pytorch as ept

    n = 96
    old = [ept.ResumableSampler(n, rank=r, num_replicas=before, seed=3) for r in range(before)]
    consumed = _lockstep(old, steps=3, batch=2)
    saved = old[0].state_dict()  # at another world size every rank resumes rank 0's copy
    new = [ept.ResumableSampler(n, rank=r, num_replicas=after, seed=3) for r in range(after)]
    for sampler in new:
        sampler.load_state_dict(saved)
    rest = [i for s in new for i in s]
    assert sorted(consumed + rest) == list(range(n))  # every sample of the epoch once
    assert all(s.epoch == 1 for s in new)  # and the epoch ended for every new rank


def test_another_world_size_through_the_loader_with_workers() -> None:
    """The loader's consumed position (not the prefetched one) is what converts to the new world size."""
    import torch

    from launchers.elastic import pytorch as ept

    dataset = torch.arange(64)

    def loader(rank: int, world: int) -> ept.ResumableLoader:
        sampler = ept.ResumableSampler(dataset, rank=rank, num_replicas=world, seed=5)
        return ept.ResumableLoader(torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=4, num_workers=2))

    old = [loader(r, 4) for r in range(4)]
    iters = [iter(o) for o in old]
    seen = [int(i) for _ in range(2) for it in iters for i in next(it)]
    saved = old[0].state_dict()
    del iters
    new = [loader(r, 2) for r in range(2)]
    for each in new:
        each.load_state_dict(saved)
    rest = [int(i) for each in new for batch in each for i in batch]
    assert sorted(seen + rest) == list(range(64))


def test_a_position_saved_for_other_data_is_refused() -> None:
    from launchers.elastic import pytorch as ept

    saved = ept.ResumableSampler(100, seed=1).state_dict()
    with pytest.raises(ept.DataPositionError, match=r"saved length 100 \(now 90\)"):
        ept.ResumableSampler(90, seed=1).load_state_dict(saved)
    with pytest.raises(ept.DataPositionError, match=r"seed 1 \(now 2\)"):
        ept.ResumableSampler(100, seed=2).load_state_dict(saved)
    ept.ResumableSampler(100, seed=1).load_state_dict({"epoch": 2, "position": 3})  # an older mlaunch's state
