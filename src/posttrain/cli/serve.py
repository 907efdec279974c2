"""`posttrain serve [CONFIG] [OVERRIDES]`: the Tinker-compatible training service (docs/tinker.md).

    posttrain serve serve.yaml                       # http://127.0.0.1:8790, base models from serve.base_models
    posttrain serve serve.base_models.smol=models/smollm2 serve.port=8791
    TINKER_BASE_URL=http://127.0.0.1:8790 TINKER_API_KEY=tml-local python my_tinker_loop.py
"""

from __future__ import annotations

from typing import Optional

import typer

from posttrain.cli.common import split_config_args
from posttrain.errors import PosttrainError

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def check_bind(host: str, port: int, api_keys: list[str]) -> None:
    """A non-loopback host needs an API key; the port must be free. PosttrainError naming serve.host/serve.port."""
    import socket

    if host not in LOOPBACK and not api_keys:
        raise PosttrainError(f"serve.host={host}: serves beyond this machine and serve.api_keys is empty",
                             hint="set serve.api_keys to keys (tml-...) your clients use, or bind 127.0.0.1")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise PosttrainError(f"serve.port={port}: cannot listen on {host}:{port} ({e.strerror})",
                                 hint="pick a free port: serve.port=N") from None


def serve(
    config: Optional[str] = typer.Argument(None, help="YAML config with a serve: section (or only overrides)."),
    overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. serve.port=8791"),
):
    """Serve the Tinker API (tinker SDK 0.38.0) over posttrain's LoRA trainer: your own Tinker loop, this machine."""
    from pathlib import Path

    from posttrain.config import load_config

    config, overrides = split_config_args(config, overrides or [])
    cfg = load_config(config, overrides).serve
    if not cfg.base_models:
        raise PosttrainError("serve.base_models is empty: nothing to serve",
                             hint="add serve.base_models.NAME=/path/to/model (the name clients pass as base_model)")
    for name, path in cfg.base_models.items():
        from posttrain.models.loading import check_model_dir

        check_model_dir(path, field=f"serve.base_models.{name}")
    check_bind(cfg.host, cfg.port, cfg.api_keys)
    import uvicorn

    from posttrain.service.app import make_app
    from posttrain.service.backend import Backend
    from posttrain.service.state import ServiceState

    backend = Backend(dict(cfg.base_models), dtype=cfg.dtype, max_lora_rank=cfg.max_lora_rank)
    state = ServiceState(backend, api_keys=cfg.api_keys, state_dir=Path(cfg.state_dir),
                         session_timeout_s=cfg.session_timeout_s, long_poll_s=cfg.long_poll_s)
    shown = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    print(f"posttrain serve: Tinker API on http://{shown}:{cfg.port} (TINKER_BASE_URL), base models "
          f"{sorted(cfg.base_models)}, dtype {cfg.dtype}, checkpoints in {cfg.state_dir}", flush=True)
    uvicorn.run(make_app(state), host=cfg.host, port=cfg.port, workers=1, log_level="warning", access_log=False)
