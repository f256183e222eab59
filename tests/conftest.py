"""Shared test set-up: nothing reaches a model hub, everything runs on the CPU with few threads."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import torch  # noqa: E402

torch.set_num_threads(2)


import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _one_ray_cluster_per_session():
    """The Ray tests share one local cluster (a start and stop costs ~5 s on 2 cores): a run reuses a running cluster
    (``init_ray``), and it is stopped once, here, at the end. A module that needs a cluster of its own stops this one
    first (test_weights_sync)."""
    yield
    import sys

    if sys.modules.get("ray") is not None:  # imported by a test (a GPU box may not have Ray at all)
        import ray

        if ray.is_initialized():
            ray.shutdown()
