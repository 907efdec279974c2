"""Starting or joining Ray. Embedded by default on 127.0.0.1 with the dashboard off, its processes in their own
session; `address` joins a running cluster. Everything Ray-specific about process start-up lives here."""

from __future__ import annotations

import contextlib
import math
import os

from posttrain.config import RayConfig
from posttrain.errors import PosttrainError

LOOPBACK = "127.0.0.1"

# Every actor's environment: libraries' own progress bars and INFO chatter stay in Ray's log files
# (/tmp/ray/session_latest/logs) instead of burying the driver's progress bar; warnings and errors still show.
QUIET_ACTOR_ENV = {
    "VLLM_LOGGING_LEVEL": "ERROR",
    "VLLM_CONFIGURE_LOGGING": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
    "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning",
}


def actor_env() -> dict[str, str]:
    """Every actor's environment variables: QUIET_ACTOR_ENV, and a recovery test's POSTTRAIN_FAULTS_DIR
    (remote/faults.py) when the driver has one: on a joined cluster the workers do not inherit the driver's
    environment."""
    from posttrain.remote.faults import ENV

    return {**QUIET_ACTOR_ENV, **({ENV: os.environ[ENV]} if os.environ.get(ENV) else {})}


def start_ray(cfg: RayConfig, needed_cpus: float) -> None:
    """Starts an embedded cluster with enough logical CPUs for the roles (they run phase by phase, so logical
    CPUs may exceed cores), or connects to cfg.address."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if cfg.address:
        use_token_auth_like_ray_start()
        try:
            ray.init(address=cfg.address, log_to_driver=cfg.log_to_driver, runtime_env={"env_vars": actor_env()})
        except Exception as e:  # noqa: BLE001 — surfaces as one clear message
            auth = "InvalidAuthToken" in str(e) or "uthentication" in type(e).__name__
            raise PosttrainError(
                f"ray.address: could not join the Ray cluster at {cfg.address}: {e}",
                hint="the cluster uses token authentication: give this machine the head's token (~/.ray/auth_token, "
                     "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH) and set RAY_AUTH_MODE=token" if auth else
                     "check `ray status` on the head node, or drop --address to run an embedded cluster",
            ) from None
        return
    pin_ray_to_loopback()
    num_cpus = cfg.num_cpus or max(float(os.cpu_count() or 1), math.ceil(needed_cpus))
    with ray_processes_in_their_own_session():
        ray.init(
            # "local": always a cluster of the run's own. Without it ray.init joins the cluster that /tmp/ray's
            # ray_current_cluster names (the last `ray start` on this machine: someone else's, or a dead one) and
            # then refuses num_cpus with a traceback.
            address="local",
            num_cpus=int(math.ceil(num_cpus)),
            _node_ip_address=LOOPBACK,
            include_dashboard=False,
            log_to_driver=cfg.log_to_driver,
            configure_logging=True,
            logging_level="warning",
            runtime_env={"env_vars": actor_env()},
        )


def use_token_auth_like_ray_start() -> None:
    """`ray start` turns token authentication on when RAY_AUTH_MODE is unset and a token exists (~/.ray/auth_token,
    which any earlier local ray.init writes), but ray.init(address=...) does not: joining such a cluster would fail
    with "InvalidAuthToken". The joining driver decides the same way `ray start` did, with Ray's own function."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without token authentication
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


@contextlib.contextmanager
def ray_processes_in_their_own_session():
    """ray.init starts the GCS, raylet, dashboard agents and monitors (and the raylet the workers) in the driver's
    process group: a SIGTERM to that group (Slurm's scancel, a container stop) or Ctrl-C's SIGINT would kill the
    cluster under the driver before it could checkpoint. Started in a session of their own, they get only the
    signals sent to them. Ray's fate-sharing still holds: each is started with PR_SET_PDEATHSIG, so it dies when
    the driver does. Without that kernel support Ray's reaper kills its process group instead: left as it is."""
    from ray._private import services, utils

    if not utils.detect_fate_sharing_support():
        yield
        return
    popen = services.ConsolePopen  # what services.start_ray_process starts every Ray process with

    class OwnSessionPopen(popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs, start_new_session=True)

    services.ConsolePopen = OwnSessionPopen
    try:
        yield
    finally:
        services.ConsolePopen = popen


def _embedded_processes() -> list:
    """The Popen of every process ray.init started for the embedded cluster (GCS, raylet, log monitor, autoscaler
    monitor, dashboard); none on a joined cluster, whose processes are not the driver's."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    return [info.process for infos in (node.all_processes.values() if node else []) for info in infos]


def embedded_cluster_stopped() -> bool:
    """Whether a process the driver started for its embedded cluster has exited: none does during a run, so the
    cluster is being stopped (a SIGTERM to every process of the run: the monitors exit within milliseconds, the
    GCS and raylet after draining for seconds). False on a joined cluster."""
    return any(process.poll() is not None for process in _embedded_processes())  # our children: poll() reaps


def pin_ray_to_loopback() -> None:
    """ray.init(_node_ip_address="127.0.0.1") alone is replaced by the machine's interface address (Ray's
    resolve_ip_for_localhost), and then the GCS, raylet, workers and agents bind their gRPC ports on it or on the
    IPv4/IPv6 wildcard addresses, i.e. on every interface (seen with psutil: tests/test_reliability_driver.py).
    Ray skips that replacement when its constant ENABLE_RAY_CLUSTER is off, and then binds every port on
    127.0.0.1. Ray reads the constant from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, when `ray` is first imported,
    which is usually before this runs: so the variable is set for child processes and the constant itself for
    this one."""
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def stop_ray(cluster_stopped: bool = False) -> None:
    """ray.shutdown. `cluster_stopped`: the embedded cluster's processes were signalled to stop already (a cgroup
    kill): they are killed rather than waited for while the GCS and raylet drain (~10 s on 2 busy cores). The
    shutdown still says goodbye to the dead GCS (~5 s of RPC timeouts): without it the core worker crashes at exit."""
    import ray

    if not ray.is_initialized():
        return
    if cluster_stopped:
        for process in _embedded_processes():
            if process.poll() is None:
                process.kill()
    ray.shutdown()
