"""The 2-node loopback cluster's facts (cluster_checks.py in a private network namespace), shared by
test_cluster_integration.py and test_scaleout_cluster.py: one cluster start for both."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def two_node_cluster_facts(tmp_path_factory, tiny_model_dir) -> dict:
    from cluster_checks import run_in_namespace

    work = tmp_path_factory.mktemp("cluster")
    return run_in_namespace(Path(__file__).parent / "cluster_checks.py", work / "facts.json", tiny_model_dir, work)
