"""The run config's `serve` section: `posttrain serve`, the Tinker-compatible training service (service/)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from posttrain.config.base import _Section


class ServeConfig(_Section):
    host: str = Field("127.0.0.1", description="Address to bind; anything but loopback needs serve.api_keys.")
    port: int = Field(8790, ge=1, le=65535, description="TCP port (a Tinker client's TINKER_BASE_URL is "
                      "http://HOST:PORT).")
    api_keys: list[str] = Field(default_factory=list, description="Accepted API keys (tml-...). Empty: any tml- "
                                "key is accepted (loopback only). Each key sees only its own models and checkpoints.")
    base_models: dict[str, str] = Field(default_factory=dict, description="SDK base_model name -> local model "
                                        "directory; create_model with another name is refused, listing these.")
    max_lora_rank: int = Field(64, ge=1, description="Largest LoRA rank a client may ask for.")
    dtype: Literal["float32", "float64", "bfloat16"] = Field(
        "float32", description="Weights' dtype; float64 for exact comparisons in tests, bfloat16 needs native CPU "
        "support.")
    state_dir: str = Field("serve-state", description="Where save_state/save_weights_for_sampler write checkpoints.")
    session_timeout_s: float = Field(60.0, gt=0, description="A session without a heartbeat for this long ends "
                                     "and its models are freed (the SDK beats every 10 s).")
    long_poll_s: float = Field(30.0, gt=0, description="How long retrieve_future holds a poll before try_again.")

    @field_validator("api_keys")
    @classmethod
    def _keys(cls, keys: list[str]) -> list[str]:
        bad = [k for k in keys if not k.startswith("tml-")]
        if bad:
            raise ValueError(f"serve.api_keys: {len(bad)} key(s) do not start with tml- (the SDK only sends such keys)")
        return keys
