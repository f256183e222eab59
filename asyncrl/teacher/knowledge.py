"""The teacher's knowledge of a batch of student samples, as tensors aligned with ``asyncrl.data.collate``.

Each sample's prompt + response goes to the teacher as one sequence; of the returned rows (row t predicts token t + 1)
the ones predicting response tokens are kept, so position ``j`` of row ``b`` holds the teacher's view of
``response_ids_BT[b, j]``. Padding positions hold a valid one-hot distribution (id 0 with log-prob 0, the other slots
id k with log-prob -inf): the losses mask them, and nothing non-finite reaches a gradient.

Also here: GKD's off-policy half (``distill.lmbda`` < 1), where a step trains on the dataset's answers instead of the
student's responses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from asyncrl.teacher.client import TeacherClient
from asyncrl.types import Sample


@dataclass
class TeacherKnowledge:
    topk_ids_BTK: Tensor  # long: the teacher's K most likely ids per response position
    topk_logp_BTK: Tensor  # float32: their log-probs (over the full vocabulary)
    token_logp_BT: Tensor  # float32: the teacher's log-prob of the response token itself
    seconds: float  # wall time of the teacher calls


def get_teacher_knowledge(client: TeacherClient, samples: list[Sample]) -> TeacherKnowledge:
    """Score every sample on the teacher (concurrent requests, bounded by the client) and align the result."""
    t0 = time.perf_counter()
    seqs = [list(s.prompt.prompt_ids) + list(s.response_ids) for s in samples]
    scored = client.topk(seqs)
    K = client.top_k
    B, T = len(samples), max(max(len(s.response_ids) for s in samples), 1)
    ids = torch.arange(K, dtype=torch.long).expand(B, T, K).clone()
    logp = torch.full((B, T, K), float("-inf"), dtype=torch.float32)
    logp[:, :, 0] = 0.0
    token = torch.zeros((B, T), dtype=torch.float32)
    for b, (s, tk) in enumerate(zip(samples, scored)):
        P, R = len(s.prompt.prompt_ids), len(s.response_ids)
        rows = slice(P - 1, P - 1 + R)  # row P-1 predicts the first response token (none when R = 0)
        ids[b, :R] = tk.ids_TK[rows]
        logp[b, :R] = tk.logp_TK[rows]
        token[b, :R] = tk.token_logp_T[rows]
    return TeacherKnowledge(ids, logp, token, time.perf_counter() - t0)


def dataset_responses(samples: list[Sample], tokenizer, eos_token_id: int, max_len: int) -> list[Sample]:
    """One sample per distinct prompt of ``samples`` whose response is the dataset's answer (+ EOS), truncated to
    ``max_len`` tokens: the supervised half of GKD's mix. Behaviour log-probs are unknown (0) and unused."""
    out: list[Sample] = []
    seen: set[str] = set()
    for s in samples:
        if s.uid in seen:
            continue
        seen.add(s.uid)
        ids = list(tokenizer(str(s.prompt.ground_truth), add_special_tokens=False)["input_ids"]) + [eos_token_id]
        ids = ids[:max_len]
        out.append(
            replace(
                s,
                response_ids=ids,
                logprobs=[0.0] * len(ids),
                versions=[s.start_version] * len(ids),
                stop_reason="eos" if ids[-1] == eos_token_id else "length",
                response_text=tokenizer.decode(ids, skip_special_tokens=True),
                reward=0.0,
                reward_failed=False,
                reward_extra={},
            )
        )
    return out
