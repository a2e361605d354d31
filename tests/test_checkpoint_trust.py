"""Loading a checkpoint runs no code: a data-only (JSON) header, plain state unless ``trusted=True``.

A checkpoint directory that someone else can write to must not be a way to run code in the
training job (torch made ``torch.load(weights_only=True)`` its default for the same reason).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import random
import struct
from collections import OrderedDict
from pathlib import Path

import pytest
from conftest import needs_torch

from launchers.elastic import Checkpointer, CheckpointError
from launchers.elastic.format import layout, shardfile

np = pytest.importorskip("numpy")


class Boom:
    """Unpickling it creates a file: proof that loading ran code."""

    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def __reduce__(self) -> tuple[object, tuple[str, ...]]:
        return (os.system, (f"touch {self.flag}",))


class Custom:
    def __init__(self, value: int) -> None:
        self.value = value


def legacy_shard(payload: object) -> bytes:
    """A shard in the old layout (MLCKPT01): its header is a pickle."""
    header = pickle.dumps(payload)
    prefix = struct.pack("<8sQQ", b"MLCKPT01", len(header), 0)
    return prefix + header + bytes(-(len(prefix) + len(header)) % 64)


def test_the_header_is_json_not_pickle(tmp_path: Path) -> None:
    shardfile.write_file(tmp_path / "s", shardfile.encode({"w": np.ones(3), "n": 1}, {"step": 2}))
    data = (tmp_path / "s").read_bytes()
    hlen, _ = shardfile.read_prefix(data)
    header = json.loads(data[shardfile.PREFIX.size : shardfile.PREFIX.size + hlen])
    assert header["meta"] == {"step": 2}


def test_a_crafted_legacy_checkpoint_runs_no_code(tmp_path: Path) -> None:
    flag = tmp_path / "pwned"
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(1, {"step": 1})
    shard = tmp_path / "ckpt" / "step_00000001" / "rank_0.mlck"
    shard.write_bytes(legacy_shard({"format": 1, "meta": {}, "skeleton": Boom(flag), "blobs": []}))
    marker = shard.parent / layout.MARKER  # the crafted file's size, as whoever crafted it would write it
    manifest = json.loads(marker.read_text())
    manifest["shards"]["0"]["bytes"] = shard.stat().st_size
    layout.write_json_atomic(marker, manifest)
    with pytest.raises(shardfile.ShardFormatError, match="trusted=True"):
        shardfile.read_file(shard)
    with pytest.raises(shardfile.ShardFormatError):
        shardfile.read_meta(shard)
    with pytest.raises(CheckpointError, match=r"older mlaunch.*trusted=True"):
        Checkpointer(tmp_path / "ckpt").load_latest()
    assert not flag.exists()


def test_a_pickle_behind_the_new_magic_runs_no_code(tmp_path: Path) -> None:
    flag = tmp_path / "pwned"
    header = pickle.dumps({"format": 2, "meta": {}, "skeleton": Boom(flag), "blobs": []})
    (tmp_path / "s").write_bytes(shardfile.PREFIX.pack(shardfile.MAGIC, len(header), 0) + header)
    with pytest.raises(shardfile.ShardFormatError):
        shardfile.read_file(tmp_path / "s", trusted=True)
    assert not flag.exists()


def test_arbitrary_objects_need_trusted_to_save(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"\['extra'\]\['obj'\] is a .*Custom.*trusted=True"):
        Checkpointer(tmp_path).save(1, {"extra": {"obj": Custom(3)}})
    assert not Checkpointer(tmp_path).committed()


def test_trusted_round_trips_objects_and_untrusted_refuses_to_load_them(tmp_path: Path) -> None:
    flag = tmp_path / "pwned"
    Checkpointer(tmp_path / "a", trusted=True).save(1, {"obj": Custom(3), "boom": Boom(flag), "w": np.ones(2)})
    with pytest.raises(CheckpointError, match="trusted=True"):
        Checkpointer(tmp_path / "a").load_latest()
    assert not flag.exists()
    Checkpointer(tmp_path / "b", trusted=True).save(1, {"obj": Custom(3), "w": np.ones(2)})
    state = Checkpointer(tmp_path / "b", trusted=True).load_latest()
    assert isinstance(state["obj"], Custom) and state["obj"].value == 3


def test_plain_state_round_trips_exactly(tmp_path: Path) -> None:
    random.seed(5)
    state = OrderedDict(
        ints={0: {"momentum": np.ones(2)}, 1: None},  # optimizer state: int keys
        groups=[{"params": [0, 1], "betas": (0.9, 0.999), "lr": 0.1, "fused": None}],
        floats=[math.inf, -math.inf, -0.0, 1e-310, 0.1],
        odd_keys={"$ref": 1, "plain": True, (1, "a"): "tuple key"},
        raw=b"\x00\xff",
        scalars=[np.float32(1.5), np.int64(-3)],
        python_rng=random.getstate(),
        numpy_rng=np.random.RandomState(3).get_state(),
        generator=np.random.default_rng(4).bit_generator.state,
        text="ünïcode",
    )
    shardfile.write_file(tmp_path / "s", shardfile.encode(state))
    back, _ = shardfile.read_file(tmp_path / "s")
    assert type(back) is OrderedDict and list(back) == list(state)
    assert back["ints"][0]["momentum"].tolist() == [1.0, 1.0] and back["ints"][1] is None
    assert back["groups"] == state["groups"] and back["odd_keys"] == state["odd_keys"]
    assert back["floats"][:2] == [math.inf, -math.inf] and math.copysign(1, back["floats"][2]) == -1
    assert back["floats"][3:] == [1e-310, 0.1] and back["raw"] == b"\x00\xff" and back["text"] == "ünïcode"
    assert back["scalars"] == state["scalars"] and type(back["scalars"][0]) is np.float32
    assert back["python_rng"] == state["python_rng"] and back["generator"] == state["generator"]
    random.setstate(back["python_rng"])
    rs = np.random.RandomState()
    rs.set_state(back["numpy_rng"])
    assert rs.randint(1 << 30) == np.random.RandomState(3).randint(1 << 30)


@needs_torch
def test_torch_plain_values_round_trip(tmp_path: Path) -> None:
    import torch

    from launchers.elastic import pytorch as ept

    state = {"rng": ept.rng_state(), "dtype": torch.bfloat16, "device": torch.device("cpu"), "size": torch.Size([2, 3])}
    shardfile.write_file(tmp_path / "s", shardfile.encode(state))
    back, _ = shardfile.read_file(tmp_path / "s")
    assert back["dtype"] is torch.bfloat16 and back["device"] == torch.device("cpu")
    assert back["size"] == torch.Size([2, 3]) and type(back["size"]) is torch.Size
    assert torch.equal(back["rng"]["torch"], state["rng"]["torch"])
    ept.set_rng_state(back["rng"])
