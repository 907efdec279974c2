"""Per-run accounting from the loop's step-time split (metrics.jsonl `time/*` keys): how long each role was busy,
the device-seconds it held, its busy fraction, and what the run cost at a price per device-hour. Pure function."""

from __future__ import annotations

# Which timed phases keep each role busy. The weight sync occupies both ends; held-out evaluation runs on the
# rollout engines.
ROLE_PHASES = {
    "trainer": ("train", "sync"),
    "reference": ("reference",),
    "reward": ("reward",),
    "rollout": ("generate", "sync", "eval"),
}


def run_accounting(records: list[dict], devices: dict[str, float], usd_per_device_hour: float) -> dict:
    """records: metrics.jsonl rows with time/step (and time/<phase>, time/eval); devices: devices held per role for
    the whole run (GPUs, or CPU slots on a CPU machine). Device-seconds = wall seconds * devices held; busy fraction
    = seconds in the role's phases / wall seconds; cost = total device-seconds * price / 3600."""
    wall = sum(r.get("time/step", 0.0) + r.get("time/eval", 0.0) for r in records if "time/step" in r)
    roles = {}
    for role, n in devices.items():
        busy = sum(r.get(f"time/{p}", 0.0) for r in records if "time/step" in r for p in ROLE_PHASES[role])
        roles[role] = {"devices": n, "busy_seconds": busy, "device_seconds": wall * n,
                       "busy_fraction": busy / wall if wall else 0.0}
    total = sum(v["device_seconds"] for v in roles.values())
    return {"wall_seconds": wall, "roles": roles, "device_seconds": total,
            "busy_device_seconds": sum(v["busy_seconds"] * v["devices"] for v in roles.values()),
            "usd_per_device_hour": usd_per_device_hour, "usd": total * usd_per_device_hour / 3600}


def devices_per_role(cfg) -> dict[str, float]:
    """Devices each role holds for the run, from the topology shares: GPUs where the config gives them, else CPU
    slots (on a CPU machine the devices are CPU slots)."""
    t = cfg.topology
    out = {"trainer": t.trainer_ranks * (t.trainer_gpus or t.trainer_cpus),
           "rollout": cfg.rollout.num_workers * (t.rollout_gpus or t.rollout_cpus),
           "reward": t.reward_cpus}
    if cfg.algorithm.kl_coef > 0:
        out["reference"] = t.reference_cpus
    return out


def accounting_for_run(cfg, records: list[dict]) -> dict:
    """run_accounting at topology.usd_per_device_hour, or the price file's default on-demand price."""
    price, source = cfg.topology.usd_per_device_hour, "topology.usd_per_device_hour"
    if price is None:
        from posttrain.cost.prices import load_prices

        row = load_prices().price()
        price, source = row.usd_per_gpu_hour, f"{row.gpu} {row.provider} {row.kind} ({row.date})"
    return {**run_accounting(records, devices_per_role(cfg), price), "price_source": source}
