"""The versioned price file (prices.yaml beside this module, or a user's own with the same layout): rows of
$/GPU-hour with a source and a date each, the self-run defaults and the on-call assumptions. Loaded and checked
here; the math is in build_vs_buy.py and oncall.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from posttrain.errors import PosttrainError

DEFAULT_PRICE_FILE = Path(__file__).with_name("prices.yaml")
ROW_KEYS = ("gpu", "provider", "kind", "usd_per_gpu_hour", "date", "source")


@dataclass(frozen=True)
class PriceRow:
    gpu: str
    provider: str
    kind: str  # on_demand | spot | reserved
    usd_per_gpu_hour: float
    date: str
    source: str


@dataclass(frozen=True)
class PriceFile:
    version: str
    default_gpu: str
    default_provider: str
    rows: list[PriceRow]
    self_run: dict[str, float]
    managed: dict[str, float]
    path: str
    on_call: dict[str, float] = field(default_factory=dict)  # assumptions for `posttrain cost --runs` (oncall.py)
    sources: dict[str, str] = field(default_factory=dict)  # "section.key" -> the value's source, e.g. "assumption: ..."

    def price(self, gpu: str | None = None, provider: str | None = None, kind: str = "on_demand") -> PriceRow:
        gpu, provider = gpu or self.default_gpu, provider or self.default_provider
        for r in self.rows:
            if r.gpu == gpu and r.provider == provider and r.kind == kind:
                return r
        have = sorted({f"{r.gpu}/{r.provider}/{r.kind}" for r in self.rows})
        raise PosttrainError(f"{self.path}: no {kind} price for {gpu} at {provider}",
                             hint=f"choose one of: {', '.join(have)}; or pass --price")


def load_prices(path: str | Path | None = None) -> PriceFile:
    p = Path(path) if path else DEFAULT_PRICE_FILE
    if not p.is_file():
        raise PosttrainError(f"price file {p} does not exist", hint="omit --prices to use the built-in file")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise PosttrainError(f"price file {p} is not valid YAML: {e}") from None
    rows = []
    for i, row in enumerate(data.get("rows") or [], start=1):
        missing = [k for k in ROW_KEYS if k not in row or row[k] in (None, "")]
        if missing:
            raise PosttrainError(f"price file {p}, row {i}: missing {', '.join(missing)}",
                                 hint="every row needs gpu, provider, kind, usd_per_gpu_hour, date and source")
        price = row["usd_per_gpu_hour"]
        if not isinstance(price, (int, float)) or price <= 0:
            raise PosttrainError(f"price file {p}, row {i}: usd_per_gpu_hour={price!r} must be a positive number")
        rows.append(PriceRow(**{k: (str(row[k]) if k != "usd_per_gpu_hour" else float(price)) for k in ROW_KEYS}))

    sources = {}

    def values(section: str) -> dict[str, float]:
        out = {}
        for k, v in (data.get(section) or {}).items():
            if not isinstance(v, dict) or "value" not in v or not v.get("source"):
                raise PosttrainError(f"price file {p}: {section}.{k} needs a value and a source")
            try:
                out[k] = float(v["value"])
            except (TypeError, ValueError):
                raise PosttrainError(f"price file {p}: {section}.{k}.value={v['value']!r} must be a number") from None
            sources[f"{section}.{k}"] = str(v["source"])
        return out

    return PriceFile(str(data.get("version", "")), str(data.get("default_gpu", "H100")),
                     str(data.get("default_provider", "")), rows, values("self_run"), values("managed"), str(p),
                     values("on_call"), sources)
