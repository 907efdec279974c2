"""Starting or joining Ray. Embedded by default on 127.0.0.1 with the dashboard off; `address` joins a running
cluster. Everything Ray-specific about process start-up lives here."""

from __future__ import annotations

import math
import os

from posttrain.config import RayConfig
from posttrain.errors import PosttrainError

LOOPBACK = "127.0.0.1"


def start_ray(cfg: RayConfig, needed_cpus: float) -> None:
    """Starts an embedded cluster with enough logical CPUs for the roles (they run phase by phase, so logical
    CPUs may exceed cores), or connects to cfg.address."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if cfg.address:
        try:
            ray.init(address=cfg.address, log_to_driver=True)
        except Exception as e:  # noqa: BLE001 — surfaces as one clear message
            raise PosttrainError(
                f"ray.address: could not join the Ray cluster at {cfg.address}: {e}",
                hint="check `ray status` on the head node, or drop --address to run an embedded cluster",
            ) from None
        return
    num_cpus = cfg.num_cpus or max(float(os.cpu_count() or 1), math.ceil(needed_cpus))
    ray.init(
        num_cpus=int(math.ceil(num_cpus)),
        _node_ip_address=LOOPBACK,
        include_dashboard=False,
        log_to_driver=True,
        configure_logging=True,
        logging_level="warning",
    )


def stop_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
