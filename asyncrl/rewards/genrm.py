"""A generative reward model (``reward.genrm.url``): a judge LLM behind an OpenAI-compatible completions server
(``asyncrl serve-teacher``, ``vllm serve``). The request, the reward P(positive) / (P(positive) + P(negative)) and its
failures: docs/rewards.md, "A generative reward model"."""

from __future__ import annotations

import math
from typing import Any

from asyncrl.http_json import JsonHttpClient
from asyncrl.rewards.remote import ERRORS, RewardServiceResponseError


def verdict_probability(top: dict[str, float], positive: str, negative: str) -> float:
    """P(positive) / (P(positive) + P(negative)) from one position's ``{token text: logprob}`` candidates."""
    p = {positive: 0.0, negative: 0.0}
    for text, logprob in top.items():
        t = text.strip().lower()
        hits = [w for w in (positive, negative) if t and w.lower().startswith(t)]
        if len(hits) == 1:  # a token that starts both words says nothing about the verdict
            p[hits[0]] += math.exp(float(logprob))
    total = p[positive] + p[negative]
    if total <= 0:
        raise ValueError(f"neither {positive!r} nor {negative!r} is among the judge's top tokens {sorted(top)}")
    return p[positive] / total


class GenerativeReward:
    """Scores one response per call (blocking, thread-safe), as ``RemoteReward`` does, so the reward loop runs it."""

    def __init__(self, cfg: Any, timeout_s: float, max_retries: int, backoff_s: float):
        self.cfg = cfg
        self.http = JsonHttpClient(cfg.url, timeout_s, max_retries, backoff_s, "generative reward model", ERRORS)
        self.url = self.http.url + self.http.prefix

    def score_one(
        self, data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
    ) -> tuple[float, dict[str, float]]:
        fields = {**{str(k): v for k, v in (extra_info or {}).items()}, "data_source": data_source}
        fields.update(solution_str=solution_str, ground_truth=ground_truth)
        try:
            prompt = self.cfg.prompt_template.format(**fields)
        except (KeyError, IndexError) as e:
            raise ValueError(f"reward.genrm.prompt_template names {e} but the fields are {sorted(fields)}") from None
        body = {
            "prompt": prompt,
            "max_tokens": 1,
            "logprobs": self.cfg.top_logprobs,
            "temperature": 0.0,
        }
        reply = self.http.request("POST", "/v1/completions", body)
        try:
            top = reply["choices"][0]["logprobs"]["top_logprobs"][0]
            if not isinstance(top, dict):
                raise TypeError(f"top_logprobs[0] is a {type(top).__name__}")
        except (KeyError, IndexError, TypeError) as e:
            raise RewardServiceResponseError(
                f"generative reward model at {self.url}: the reply has no choices[0].logprobs.top_logprobs[0] ({e})"
            ) from None
        p = verdict_probability(top, self.cfg.positive, self.cfg.negative)
        return p, {"genrm_p_positive": p}

    def close(self) -> None:
        self.http.close()
