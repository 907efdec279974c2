"""Rewrites the README's generated block (the config reference) from the code. Run by `make readme`."""

import re
from pathlib import Path

from posttrain.config import config_reference_markdown

readme = Path(__file__).resolve().parents[1] / "README.md"
text = readme.read_text()
block = f"<!-- config-reference:start -->\n{config_reference_markdown()}\n<!-- config-reference:end -->"
text = re.sub(r"<!-- config-reference:start -->.*?<!-- config-reference:end -->", lambda _m: block, text, flags=re.S)
readme.write_text(text)
print(f"updated {readme}")
