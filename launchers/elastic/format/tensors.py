"""The bytes of a tensor, read safely — and the local shard of a DTensor with where it lies in the whole.

Why this module exists: a checkpoint copies tensor memory as raw bytes (staging to shared
memory, writing a shard file) without pickling it. Reading raw memory through
``data_ptr()`` is only sound for a plain dense strided tensor whose storage holds exactly
the bytes read. A tensor *subclass* breaks that: a ``DTensor``'s ``data_ptr()`` is not the
storage of its local shard (it is 0 for FSDP2 parameters) and its ``numel()`` is the global
size, so reading "numel × itemsize bytes from data_ptr()" read unmapped memory (SIGSEGV in
the rank, or ``EFAULT`` from ``write``). Wrapper subclasses (Float8, functional, fake
tensors) are the same hole. So:

- a plain tensor (``type(t.detach()) is torch.Tensor``) is read after checking that its
  storage covers what is read (``plain_bytes``);
- a ``DTensor`` is saved as its local shard (``to_local()``, itself checked the same way)
  plus JSON metadata: the global shape, this shard's offsets and sizes in it (as DCP
  computes them), the placements and the mesh (``dtensor_shard``); a shard that another
  rank holds as well (a ``Replicate`` mesh dimension) is stored by the replica at
  coordinate 0 only, as DCP's de-duplication does;
- any other subclass, a meta tensor (no data at all) and a ``Partial`` placement (a
  reduction still pending) are refused with an ``UnsupportedTensor`` naming the key. A
  checkpoint created with ``trusted=True`` pickles subclasses instead (``None`` here).

Torch is used only when the caller's process imported it; this module imports nothing heavy.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any

from launchers.elastic.format import plain


class UnsupportedTensor(plain.UnsafeState):
    """A tensor whose bytes cannot be read safely as they are (the message names the key and what to do)."""


@dataclass(frozen=True)
class TensorBytes:
    """A tensor's dtype name, shape and memory (a view kept valid by ``keep``).

    ``device``: the tensor still on its accelerator (contiguous), its bytes not yet copied to
    host memory; ``view`` is then empty and ``nbytes`` says how many bytes the copy will be
    (``plain_bytes(..., on_device=True)``: the device stager copies them without blocking).
    """

    dtype: str
    shape: tuple[int, ...]
    view: memoryview
    keep: Any
    device: Any = None

    @property
    def nbytes(self) -> int:
        if self.device is not None:
            return int(self.device.numel() * self.device.element_size())
        return self.view.nbytes


def _type_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def plain_bytes(tensor: Any, where: str, *, on_device: bool = False) -> TensorBytes | None:
    """The raw bytes of a plain dense tensor (copied to CPU/contiguous only when needed).

    ``on_device``: a tensor on an accelerator stays there (``TensorBytes.device``), made
    contiguous on the device; the caller copies it to host memory on a stream of its own.

    None for layouts the shard format does not store as bytes (sparse, quantized, nested):
    those are pickled when the checkpoint is trusted, refused otherwise. Raises
    ``UnsupportedTensor`` for a subclass or a tensor without data.
    """
    torch = sys.modules["torch"]
    t = tensor.detach()
    if type(t) is not torch.Tensor:
        raise UnsupportedTensor(
            f"{where} is a {_type_name(tensor)}, a tensor subclass whose memory is not its data: a checkpoint "
            "holds plain tensors and DTensors (convert it first, e.g. .to_local(), .dequantize() or "
            "torch.Tensor(...)), unless the Checkpointer is created with trusted=True (then it is pickled)"
        )
    if t.device.type == "meta":
        raise UnsupportedTensor(
            f"{where} is a tensor on the meta device: it has a shape but no data to save "
            "(materialise the model first, e.g. model.to_empty(device=...) and initialise or load it)"
        )
    if t.layout != torch.strided or t.is_quantized or getattr(t, "is_nested", False):
        return None
    kept_on_device = on_device and t.device.type != "cpu"
    if t.device.type != "cpu" and not kept_on_device:
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    t = t.contiguous()
    dtype = str(t.dtype).removeprefix("torch.")
    if kept_on_device:
        return TensorBytes(dtype, tuple(t.shape), memoryview(b""), t, device=t)
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return TensorBytes(dtype, tuple(t.shape), memoryview(b""), t)
    storage = t.untyped_storage()
    start = t.storage_offset() * t.element_size()
    if storage.data_ptr() == 0 or t.data_ptr() != storage.data_ptr() + start or start + nbytes > storage.nbytes():
        raise UnsupportedTensor(f"{where}: the tensor's storage does not hold its {nbytes} bytes of data")
    raw = (ctypes.c_ubyte * nbytes).from_address(t.data_ptr())
    return TensorBytes(dtype, tuple(t.shape), memoryview(raw).cast("B"), t)


def dtensor_class() -> Any:
    """``DTensor`` when this process imported it (a state cannot hold one otherwise), else None."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


@dataclass(frozen=True)
class DShard:
    """What a DTensor contributes to a checkpoint from this rank: its local shard, or nothing (a replica)."""

    local: Any  # the local tensor (None: another replica stores this shard)
    meta: dict[str, Any]  # JSON: global shape, dtype, offsets, sizes, placements, mesh


def dtensor_shard(dt: Any, where: str) -> DShard:
    """This rank's shard of ``dt`` and its place in the global tensor (DCP's chunk of it)."""
    placements = list(dt.placements)
    pending = [str(p) for p in placements if p.is_partial()]
    if pending:
        raise UnsupportedTensor(
            f"{where} is a DTensor with a pending reduction ({', '.join(pending)}): reduce it first, e.g. "
            "dt.redistribute(placements=[Replicate()] * mesh.ndim), then save"
        )
    chunk = dt.__create_chunk_list__()[0]  # DCP's own view of this rank's piece: offsets and sizes
    mesh = dt.device_mesh
    coordinate = mesh.get_coordinate() or []
    stored = all(coordinate[i] == 0 for i, p in enumerate(placements) if p.is_replicate() and i < len(coordinate))
    meta = {
        "shape": list(dt.shape),
        "dtype": str(dt.dtype).removeprefix("torch."),
        "offsets": list(chunk.offsets),
        "sizes": list(chunk.sizes),
        "placements": [str(p) for p in placements],
        "mesh": list(mesh.shape),
        "mesh_dims": list(mesh.mesh_dim_names or []),
        "coordinate": list(coordinate),
        "stored": stored,
    }
    local = dt.to_local() if stored else None
    if local is not None and list(local.shape) != meta["sizes"]:
        raise UnsupportedTensor(
            f"{where}: the DTensor's local shard has shape {list(local.shape)}, but its placements put "
            f"{meta['sizes']} here (a padded or strided shard layout this version does not save)"
        )
    return DShard(local, meta)
