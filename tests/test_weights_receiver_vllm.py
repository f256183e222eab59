"""The weight-sync receiver feeding a real vLLM engine bucket by bucket (the ``vllm`` extra; ``make test-vllm``).

One ``reload_weights`` pulls the buckets as they arrive over a real gloo group (tens of buckets for the test model,
so layers are split across buckets); afterwards the engine samples with the trainer's log-probs. A sync cut short by
a corrupt bucket leaves vLLM with part of the new weights: the engine refuses to generate until the next sync.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="the vllm extra is not installed (pip install -e '.[vllm]', or make test-vllm)")

from asyncrl.models.loading import load_model  # noqa: E402
from asyncrl.models.lora import synced_tensors  # noqa: E402
from asyncrl.rollout.gate import PartialWeightsError  # noqa: E402
from asyncrl.rollout.sampling import SamplingParams  # noqa: E402
from asyncrl.rollout.vllm_engine import VllmEngine  # noqa: E402
from asyncrl.weights.errors import WeightSyncError  # noqa: E402
from tests.helpers import make_data, make_model  # noqa: E402
from tests.test_vllm import OPTIONS, assert_follows, prompts  # noqa: E402
from tests.test_weights_receiver import close, connect, sync  # noqa: E402

pytestmark = pytest.mark.vllm
PARAMS = SamplingParams(n=2, temperature=0.8, max_new_tokens=10)


def test_vllm_loads_a_sync_bucket_by_bucket_and_refuses_to_generate_on_a_sync_cut_short(tmp_path):
    train, _ = make_data(tmp_path, size=32, test_size=8)
    a = make_model(tmp_path, train, preset="mini", seed=0)
    b = make_model(tmp_path / "b", train, preset="mini", seed=7)
    old, tok = load_model(a, for_training=False)
    new, _ = load_model(b, for_training=False)
    engine = VllmEngine(str(a), tok, OPTIONS)
    sent = synced_tensors(new)
    sender, workers = connect(sent, [engine])
    try:
        buckets = len(sender.plan.buckets)
        assert buckets > 10
        _, err = sync(sender, workers, sent, version=3, corrupt=buckets // 2)
        assert isinstance(err, WeightSyncError) and "buckets were applied before it failed" in str(err)
        assert engine.version == 0 and engine.partial_weights is not None
        with pytest.raises(PartialWeightsError):
            engine.generate(prompts(tok), PARAMS, seed=1)

        _, stats = sync(sender, workers, sent, version=4)
        assert not isinstance(stats, Exception), stats
        assert engine.version == 4 and engine.partial_weights is None
        samples = engine.generate(prompts(tok), PARAMS, seed=1)
        assert all(set(s.versions) <= {4} for s in samples)
        assert_follows(engine, samples, new, old, "vLLM after a bucket-by-bucket sync")
    finally:
        close(sender, workers)
