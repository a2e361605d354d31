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


def test_the_sampler_alone_runs_ahead_with_workers() -> None:
    """Why the wrapper exists: the sampler's own position counts prefetched indices too."""
    import torch

    from launchers.elastic import pytorch as ept

    dataset = torch.arange(64)
    sampler = ept.ResumableSampler(dataset, seed=7)
    loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    assert sampler.state_dict()["position"] > 4  # 2 workers × prefetch 2 batches ahead
    del it
