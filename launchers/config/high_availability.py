"""The ``high_availability:`` section of job.yaml: MindIO TFT features, TaskD, the parallel sizes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from launchers.address import AddressError, split_host_port
from launchers.config.fields import Section
from launchers.config.limits import MAX_COUNT, MAX_WORLD_SIZE

TFT_CONTROLLER_PORT = 30051  # the TFT controller's port when high_availability.controller names a host alone

RecoverStrategy = Literal["retry", "recover", "recover-in-place", "elastic-training", "dump", "exit"]


class HighAvailabilityOptions(Section):
    """``high_availability:`` — MindIO TFT / TaskD wiring (owned by the HA work).

    TFT features (``ttp``, ``uce``, ``arf``) set MindIO's env for MindSpore/MindFormers;
    ``taskd`` starts MindCluster's TaskD manager beside node 0's processes. Both need a
    replica relation (``dp / optimizer_shard`` ≥ 2), checked before launch.
    """

    ttp: bool = Field(False, description="TTP: dying checkpoint written by one healthy rank per replica group")
    uce: bool = Field(False, description="UCE: on-chip memory fault repair (implies ttp)")
    arf: bool = Field(False, description="ARF: process-level rescheduling (implies ttp)")
    controller: str | None = Field(
        None, description="HOST:PORT (or HOST) of the TFT controller → MS_TFT_IP/MS_TFT_PORT; default node 0:30051"
    )
    dp: int = Field(1, ge=1, le=MAX_WORLD_SIZE, description="data-parallel size (data_parallel)")
    tp: int = Field(1, ge=1, le=MAX_WORLD_SIZE, description="tensor/model-parallel size (model_parallel)")
    pp: int = Field(1, ge=1, le=MAX_WORLD_SIZE, description="pipeline stages (pipeline_stage)")
    optimizer_shard: int = Field(
        1, ge=1, le=MAX_WORLD_SIZE, description="optimizer_weight_shard_size (1 = optimizer parallel off)"
    )
    sink_size: int = Field(1, ge=1, le=MAX_COUNT, description="MindSpore data sink size; MindIO TFT works only with 1")
    taskd: bool = Field(False, description="start MindCluster's TaskD manager on node 0 and preload libtaskd.so")
    mindspeed_flags: bool = Field(
        False, description="append --enable-high-availability --enable-hbmfault-repair to the start file's args"
    )
    hccl_op_retry: str = Field("L0:0, L1:1, L2:1", description="HCCL_OP_RETRY_ENABLE when taskd is on")
    recover_strategy: list[RecoverStrategy] | None = Field(
        None,
        description="MindCluster recover-strategy annotation; default from the features: "
        "uce or taskd → retry, arf → recover, ttp → dump",
    )

    @field_validator("controller")
    @classmethod
    def _controller(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            split_host_port(value, "high_availability.controller", default_port=TFT_CONTROLLER_PORT)
        except AddressError:
            raise ValueError("expected HOST:PORT or HOST, e.g. 10.0.0.1:30051") from None
        return value.strip()

    @property
    def enabled(self) -> bool:
        """Whether any high-availability feature is asked for (TFT features or TaskD)."""
        return self.ttp or self.uce or self.arf or self.taskd

    @property
    def tft(self) -> bool:
        """Whether MindIO TFT (TTP/UCE/ARF) is asked for."""
        return self.ttp or self.uce or self.arf
