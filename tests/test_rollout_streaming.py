"""The built-in engine's streaming decoder (asyncrl.rollout.continuous): rows enter a running decode at any step and
draw the tokens the batch decoder draws for them, whatever the admission order, interruptions or slot reuse."""

import heapq
import random
import string
import threading
from dataclasses import replace

import pytest
import torch

from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.gate import EngineBusyError
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.rollout.slot_cache import SlotCache
from asyncrl.rollout.streaming import StreamingEngine
from asyncrl.types import Prompt, Sample

TEXTS = ["a", "hello world", "What is 2+2? Think step by step.", "xy", "The quick brown fox jumps", "zz top 42"]
PARAMS = SamplingParams(n=3, temperature=1.0, max_new_tokens=24)
LOGPROB_ATOL = 1e-6  # other padding than the batch decoder's: float rounding only


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny batches: a second intra-op thread only adds sync overhead (and stalls badly on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer([string.printable[:95]])


def eos_model(tok, eos_bias: float):
    """A micro model whose eos logit is shifted by ``eos_bias`` (+3: rows end at many different steps; -1e4: never)."""
    model = build_model("micro", tok, seed=0)
    eos = torch.tensor([tok.eos_token_id])
    model.lm_head.register_forward_hook(
        lambda m, i, out: out.index_add_(-1, eos, torch.full_like(out[..., :1], eos_bias))
    )
    return model


@pytest.fixture(scope="module")
def model(tok):
    return eos_model(tok, 3.0)


@pytest.fixture(scope="module")
def endless(tok):
    return eos_model(tok, -1e4)


def blanks(tok, texts=TEXTS, n=PARAMS.n) -> list[Sample]:
    prompts = [
        Prompt(index=i, prompt_ids=tok.encode(t), data_source="test", ground_truth="") for i, t in enumerate(texts)
    ]
    return [Sample.blank(p, 0, j) for p in prompts for j in range(n)]


def key(sample: Sample) -> tuple[int, int]:
    return sample.prompt.index, sample.row


def assert_same_rows(reference: list[Sample], streamed: list[Sample]) -> None:
    """Same rows, same tokens and stop reasons; log-probs within LOGPROB_ATOL."""
    got = {key(s): s for s in streamed}
    assert sorted(got) == sorted(key(s) for s in reference)
    for ref in reference:
        s = got[key(ref)]
        assert (s.response_ids, s.stop_reason) == (ref.response_ids, ref.stop_reason), key(ref)
        assert len(s.logprobs) == len(s.versions) == len(s.response_ids)
        diff = max((abs(a - b) for a, b in zip(s.logprobs, ref.logprobs)), default=0.0)
        assert diff <= LOGPROB_ATOL, (key(ref), diff)
    assert len({tuple(s.response_ids) for s in reference}) > len(reference) // 2  # rows differ: not a constant output


def stream_randomly(engine: RolloutEngine, rows: list[Sample], params, seed: int, rng: random.Random) -> list[Sample]:
    """Submit ``rows`` in shuffled groups of 1-4 at random steps while others decode; every row's final sample."""
    waiting = rows[:]
    rng.shuffle(waiting)
    done: list[Sample] = []
    while waiting or engine.live_rows():
        if waiting and (rng.random() < 0.4 or not engine.live_rows()):
            k = rng.randint(1, 4)
            engine.submit(waiting[:k], params, seed)
            waiting = waiting[k:]
        done += engine.step()
    return done


@pytest.mark.parametrize("order", [0, 1, 2])
def test_streamed_rows_draw_the_batch_decoders_tokens_in_any_admission_order(model, tok, order):
    rows = blanks(tok)
    reference = RolloutEngine(model, tok).resume(rows, PARAMS, seed=11)
    assert len({len(s.response_ids) for s in reference}) >= 4  # rows end at different steps
    engine = RolloutEngine(model, tok, max_batch_size=5)  # fewer slots than rows: slots are reused
    streamed = stream_randomly(engine, rows, PARAMS, 11, random.Random(order))
    assert_same_rows(reference, streamed)
    assert engine.live_rows() == 0 and not engine.busy


def test_generate_and_streaming_agree_greedy_too(endless, tok):
    rows = blanks(tok, n=1)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    prompts = [r.prompt for r in rows]
    reference = RolloutEngine(endless, tok).generate(prompts, greedy, seed=0)
    streamed = stream_randomly(RolloutEngine(endless, tok, max_batch_size=2), rows, greedy, 0, random.Random(3))
    assert_same_rows(reference, streamed)


def test_eos_ids_assigned_after_construction_reach_the_streamed_rows(model, tok):
    rows = blanks(tok)
    never = [10**9]  # no token id: every row runs to its budget
    reference = RolloutEngine(model, tok, eos_token_ids=never).resume(rows, PARAMS, seed=2)
    assert {s.stop_reason for s in reference} == {"length"}
    engine = RolloutEngine(model, tok, max_batch_size=4)  # the tokenizer's eos, which this model draws often
    engine.eos_token_ids = never
    assert_same_rows(reference, stream_randomly(engine, rows, PARAMS, 2, random.Random(0)))
    with pytest.raises(ValueError, match="no eos token ids"):
        engine.eos_token_ids = []


@pytest.mark.parametrize("stops", [(1,), (3, 7), (5, 6, 15)])
def test_interrupted_and_resubmitted_rows_continue_as_if_never_interrupted(model, tok, stops):
    rows = blanks(tok)
    reference = RolloutEngine(model, tok).resume(rows, PARAMS, seed=4)
    engine = RolloutEngine(model, tok, max_batch_size=7)
    rng = random.Random(sum(stops))
    done: list[Sample] = []
    todo, partial = rows, 0
    for k in stops:
        rng.shuffle(todo)
        engine.submit(todo, PARAMS, seed=4)
        for _ in range(k):
            done += engine.step()
        todo = engine.interrupt()
        assert engine.live_rows() == 0
        assert all(s.stop_reason == "interrupted" for s in todo)
        assert all(len(s.response_ids) == len(s.logprobs) == len(s.versions) for s in todo)
        partial += sum(0 < len(s.response_ids) for s in todo)
    assert partial >= len(stops)  # rows were cut part-way, not only before they started
    engine.submit(todo, PARAMS, seed=4)
    done += engine.drain()
    assert_same_rows(reference, done)


def test_prefill_buckets_split_by_length_only_where_padding_wastes_more_than_a_forward():
    from asyncrl.rollout.continuous import prefill_buckets

    assert prefill_buckets([40, 41, 39, 40], min_saved=16) == [[0, 1, 2, 3]]  # alike: one forward
    assert prefill_buckets([7], min_saved=0) == [[0]]
    runs = prefill_buckets([300, 10, 290, 12, 8], min_saved=100)
    assert sorted(sorted(r) for r in runs) == [[0, 2], [1, 3, 4]]  # the long ones apart from the short ones
    lengths = [5, 300, 17, 120, 64, 3, 250, 90, 31, 200]
    for min_saved in (0, 10, 100, 1000, 10**6):
        runs = prefill_buckets(lengths, min_saved)
        assert sorted(i for r in runs for i in r) == list(range(len(lengths)))  # each prefix in one forward
        padded = sum(len(r) * max(lengths[i] for i in r) for r in runs)
        assert padded + min_saved * len(runs) <= len(lengths) * max(lengths) + min_saved  # never worse than one
    assert len(prefill_buckets(lengths, 0)) > 1 and len(prefill_buckets(lengths, 10**6)) == 1


def test_interrupted_rows_taken_back_in_several_prefill_forwards_draw_the_same_tokens(model, tok, monkeypatch):
    """A sync's interrupted rows come back with partial responses of many lengths: split into prefill forwards by
    length (a forward whenever it saves a padded position here), they still continue as if never interrupted."""
    from asyncrl.rollout import continuous

    monkeypatch.setattr(continuous, "MIN_SAVED_POSITIONS", 1)
    forwards = []
    split = continuous.prefill_buckets

    def counted(lengths: list[int], min_saved: int) -> list[list[int]]:
        runs = split(lengths, min_saved)
        forwards.append(len(runs))
        return runs

    monkeypatch.setattr(continuous, "prefill_buckets", counted)
    rows = blanks(tok)
    reference = RolloutEngine(model, tok).resume(rows, PARAMS, seed=6)
    engine = RolloutEngine(model, tok, max_batch_size=len(rows))
    engine.submit(rows, PARAMS, seed=6)
    done: list[Sample] = []
    for k in (2, 9):  # rows cut at different lengths: the second re-admission mixes short and long partials
        for _ in range(k):
            done += engine.step()
        todo = engine.interrupt()
        engine.submit(todo, PARAMS, seed=6)
    done += engine.drain()
    assert max(forwards) > 1  # some admission really went in several forwards
    assert_same_rows(reference, done)


def test_a_row_submitted_mid_stream_enters_at_the_next_step(endless, tok):
    engine = RolloutEngine(endless, tok, max_batch_size=4)
    first, late = blanks(tok, n=1)[:2], blanks(tok, n=1)[2:3]
    engine.submit(first, PARAMS, seed=1)
    for _ in range(3):
        assert engine.step() == []
    engine.submit(late, PARAMS, seed=1)
    assert engine.live_rows() == 3
    assert engine.step() == []
    assert not endless.training  # eval while streaming, the training flag back once the decoder is empty
    out = engine.interrupt()
    assert endless.training
    assert [len(s.response_ids) for s in out] == [4, 4, 1]  # submission order; the late row drew at its first step
    assert all(s.stop_reason == "interrupted" for s in out)
    assert all(len(s.response_ids) == len(s.logprobs) == len(s.versions) for s in out)
    assert engine.live_rows() == 0 and engine.interrupt() == [] and engine.step() == []


def test_freed_slots_are_reused_and_never_more_than_capacity_rows_decode(model, tok):
    batches: list[int] = []
    handle = model.register_forward_pre_hook(
        lambda m, a, kw: batches.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        engine = RolloutEngine(model, tok, max_batch_size=2)
        rows = blanks(tok, n=1) + blanks(tok, n=1)[:1]
        rows[-1] = replace(rows[-1], row=1)
        engine.submit(rows, PARAMS, seed=2)
        done = engine.drain()
    finally:
        handle.remove()
    assert sorted(map(key, done)) == sorted(map(key, rows))
    assert all(s.stop_reason in ("eos", "length") for s in done)
    assert max(batches) == 2 and engine.live_rows() == 0


def test_a_groups_blank_rows_share_one_prefill(model, tok):
    prefills: list[int] = []

    def hook(module, args, kwargs):
        if kwargs["input_ids"].shape[1] > 1:
            prefills.append(kwargs["input_ids"].shape[0])

    rows = blanks(tok, TEXTS[:3], n=4)
    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        engine = RolloutEngine(model, tok)
        engine.submit(rows, PARAMS, seed=5)
        engine.step()
    finally:
        handle.remove()
    stats = engine.take_prefill()
    prompt_tokens = sum(len(tok.encode(t)) for t in TEXTS[:3])
    assert prefills == [3] and stats.tokens == prompt_tokens and stats.unshared_tokens == 4 * prompt_tokens
    assert stats.tokens < stats.unshared_tokens
    assert engine.take_prefill().tokens == 0  # zeroed by the call
    assert_same_rows(RolloutEngine(model, tok).resume(rows, PARAMS, seed=5), engine.drain())


def test_weights_wait_for_the_streamed_rows_and_versions_follow_an_update(tok):
    model = eos_model(tok, -1e4)  # updated in place below: a model of its own
    engine = RolloutEngine(model, tok)
    assert isinstance(engine, StreamingEngine) and engine.capacity == engine.max_batch_size
    weights = {name: t + 0.05 for name, t in engine.state_dict_for_sync().items()}
    rows = blanks(tok, n=1)[:3]
    engine.submit(rows, PARAMS, seed=6)
    engine.step()
    assert engine.busy
    with pytest.raises(EngineBusyError, match="streamed rows"):
        engine.update_weights(weights, version=1)
    with pytest.raises(EngineBusyError, match="streamed rows"):
        engine.generate([rows[0].prompt], PARAMS, seed=0)
    with pytest.raises(EngineBusyError, match="streamed rows"):
        engine.resume(rows, PARAMS, seed=0)
    engine.step()
    partial = engine.interrupt()
    engine.update_weights(weights, version=1)
    assert engine.version == 1
    engine.submit(partial, PARAMS, seed=6)
    done = engine.drain()
    for s in done:
        assert s.versions == [0, 0] + [1] * (PARAMS.max_new_tokens - 2) and s.start_version == 0
        assert s.stop_reason == "length" and len(s.logprobs) == PARAMS.max_new_tokens


def test_rows_that_need_no_decoding_come_back_at_the_next_step(model, tok):
    engine = RolloutEngine(model, tok)
    finished = replace(blanks(tok, n=1)[0], response_ids=[5, 6], logprobs=[-1.0, -2.0], versions=[0, 0])
    finished.stop_reason = "eos"
    full = replace(blanks(tok, n=1)[1], response_ids=[7] * 24, logprobs=[-1.0] * 24, versions=[0] * 24)
    engine.submit([finished, full], PARAMS, seed=0)
    assert engine.live_rows() == 2
    out = engine.step()
    assert out[0] is finished and out[1].stop_reason == "length" and out[1].response_ids == full.response_ids
    assert engine.live_rows() == 0 and engine.take_prefill().unshared_tokens == 0


def test_live_rows_pin_params_and_seed(model, tok):
    engine = RolloutEngine(model, tok)
    rows = blanks(tok, n=1)
    engine.submit(rows[:2], PARAMS, seed=1)
    with pytest.raises(ValueError, match="seed 2 .* seed 1"):
        engine.submit(rows[2:3], PARAMS, seed=2)
    with pytest.raises(ValueError, match="max_new_tokens=8"):
        engine.submit(rows[2:3], replace(PARAMS, max_new_tokens=8), seed=1)
    assert engine.live_rows() == 2
    engine.interrupt()
    engine.submit(rows[2:3], PARAMS, seed=2)  # nothing live: new params and seed are fine
    assert len(engine.drain()) == 1


def test_drain_finishes_what_was_submitted_before_it(model, tok):
    engine = RolloutEngine(model, tok, max_batch_size=3)
    rows = blanks(tok)
    late = rows[12:]
    submitted: list[bool] = []

    def hook(module, args, kwargs):  # another thread's submit, landing while drain runs
        if not submitted:
            submitted.append(True)
            engine.submit(late, PARAMS, seed=9)

    engine.submit(rows[:12], PARAMS, seed=9)
    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        first = engine.drain()
    finally:
        handle.remove()
    assert sorted(map(key, first)) == sorted(map(key, rows[:12]))
    assert engine.live_rows() == len(late)
    assert_same_rows(RolloutEngine(model, tok).resume(rows, PARAMS, seed=9), first + engine.drain())


def test_rows_submitted_from_another_thread(model, tok):
    rows = blanks(tok)
    engine = RolloutEngine(model, tok, max_batch_size=4)

    def producer():
        for i in range(0, len(rows), 2):
            engine.submit(rows[i : i + 2], PARAMS, seed=3)

    thread = threading.Thread(target=producer)
    done: list[Sample] = []
    thread.start()
    while len(done) < len(rows):
        done += engine.step()
    thread.join()
    assert_same_rows(RolloutEngine(model, tok).resume(rows, PARAMS, seed=3), done)


def test_the_window_moves_and_grows_under_long_and_short_rows(endless, tok, monkeypatch):
    """A long prefix arriving after short rows (window moved right), rows outgrowing the columns and slots (new
    buffers), a long row ending among short ones (dead columns dropped): the tokens stay the batch decoder's."""
    moves: set[str] = set()
    relayout = SlotCache.relayout

    def spy(self, used, width, new_p, rows, columns, like=None):
        if self.rows and (rows > self.rows or columns > self.columns):
            moves.add("grow")
        elif new_p > self.p:
            moves.add("right")
        elif new_p < self.p:
            moves.add("left")
        relayout(self, used, width, new_p, rows, columns, like)

    monkeypatch.setattr(SlotCache, "relayout", spy)
    texts = ["ab", "x" * 6, "long prompt " * 5, "q", "medium length one", "k" * 45, "yz"]
    rows = blanks(tok, texts, n=2)
    params = replace(PARAMS, max_new_tokens=20)
    engine = RolloutEngine(endless, tok, max_batch_size=3)
    streamed = []
    for i in range(0, len(rows), 2):
        engine.submit(rows[i : i + 2], params, seed=8)
        for _ in range(7):
            streamed += engine.step()
    streamed += engine.drain()
    assert moves == {"grow", "right", "left"}
    assert_same_rows(RolloutEngine(endless, tok).resume(rows, params, seed=8), streamed)


def test_sliding_window_layers_stream_as_one_call_decodes_them(tok):
    """A model with a sliding-window layer (window 4, shorter than every prompt): rows streamed two at a time draw
    what one ``resume`` call over them all draws."""
    model = build_model("micro", tok, seed=0, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    rows = blanks(tok)
    engine = RolloutEngine(model, tok, max_batch_size=3)
    streamed = []
    for i in range(0, len(rows), 2):
        engine.submit(rows[i : i + 2], PARAMS, seed=6)
        streamed += engine.step()
    streamed += engine.drain()
    assert_same_rows(RolloutEngine(model, tok).resume(rows, PARAMS, seed=6), streamed)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_simulator_runs_the_slots_the_built_in_decoder_runs(endless, tok, seed):
    """The performance model prices a built-in engine's decode step by its slots in use (``planning.slots.SimRank``):
    for rows of known lengths entering a full decoder, every step's forward batch of the real decoder equals the
    simulated rank's slots in use."""
    from asyncrl.planning.slots import SimRank, SimRow
    from asyncrl.rollout.continuous import ContinuousDecoder, StreamRow

    rng = random.Random(seed)
    capacity, needs = 6, [rng.choice([1, 2, 3, 5, 9, 17]) for _ in range(20)]
    batches: list[int] = []  # the real decoder's decode forwards (one new token per row), per step
    handle = endless.register_forward_pre_hook(
        lambda m, a, kw: batches.append(kw["input_ids"].shape[0]) if kw["input_ids"].shape[1] == 1 else None,
        with_kwargs=True,
    )
    try:
        dec = ContinuousDecoder(endless, capacity, eos_ids=[], pad_id=tok.pad_token_id)
        dec.submit([StreamRow(i, tok.encode(f"row {i}:"), need, key=i, offset=0) for i, need in enumerate(needs)])
        real, ended = [], 0
        while ended < len(needs):
            before = len(batches)
            ended += len(dec.step(PARAMS))
            real.append(batches[-1] if len(batches) > before else 0)
    finally:
        handle.remove()

    rank = SimRank(capacity, waiting=[SimRow(None, need) for need in needs])  # type: ignore[arg-type]
    rank.fill()
    simulated = []
    while rank.live or rank.waiting:
        rank.t += 1
        done = []
        while rank.live and rank.live[0][0] <= rank.t:
            done.append(heapq.heappop(rank.live)[2])
        rank.end(done)
        simulated.append(len(rank.used) if rank.live else 0)
        rank.fill()
    assert simulated == real
    assert len(set(real)) > 2  # the scene packs and refills: more than one batch size
