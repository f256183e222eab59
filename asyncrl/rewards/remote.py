"""A reward service over HTTP (``reward.remote_url``): one POST per response (or per batch, ``score_many``), verl's
reward-function fields as JSON; the protocol is docs/rewards.md's, "The reward loop and a reward service". The
transport (keep-alive, retries with back-off, timeouts) is ``asyncrl.http_json``'s.

A service down after every retry raises ``RewardServiceUnavailableError`` naming the URL: the rollout stops there,
instead of silently scoring every sample as failed. A rejected (HTTP 4xx) or malformed reply fails its sample only.
"""

from __future__ import annotations

from typing import Any

from asyncrl.errors import UserInputError
from asyncrl.http_json import ErrorKinds, JsonHttpClient
from asyncrl.rewards.reward_fn import normalize_result


class RewardServiceError(UserInputError, RuntimeError):
    """Base class of the reward service's errors; the message names its URL."""


class RewardServiceUnavailableError(RewardServiceError):
    """The service could not be reached, or kept failing (5xx, timeouts), after all retries."""


class RewardServiceRejectedError(RewardServiceError):
    """The service rejected one request (HTTP 4xx, in ``status``)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class RewardServiceResponseError(RewardServiceError):
    """The service answered, but not with a score."""


# ``score_one``'s arguments: data source, response text, ground truth, extra info
Args = tuple[str, str, str, dict[str, Any] | None]


def _body(data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "data_source": data_source,
        "solution_str": solution_str,
        "ground_truth": ground_truth,
        "extra_info": dict(extra_info or {}),
    }


ERRORS = ErrorKinds(RewardServiceUnavailableError, RewardServiceRejectedError, RewardServiceResponseError)


class RemoteReward:
    """Scores one response per call (blocking; thread-safe, one kept-alive connection per calling thread)."""

    def __init__(self, url: str, timeout_s: float, max_retries: int, backoff_s: float):
        self.http = JsonHttpClient(url, timeout_s, max_retries, backoff_s, "reward service", ERRORS)
        self.url = self.http.url + self.http.prefix

    def score_one(
        self, data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
    ) -> tuple[float, dict[str, float]]:
        reply = self.http.request("POST", "", _body(data_source, solution_str, ground_truth, extra_info))
        try:
            return normalize_result(reply, f"reward service at {self.url}")
        except ValueError as e:
            raise RewardServiceResponseError(str(e)) from None

    def score_many(self, items: list[Args]) -> list[tuple[float, dict[str, float]] | RewardServiceError]:
        """Several responses in one request (``score_one``'s arguments each): each one's result, or the error that
        fails that one. A request that fails (the service down, a 4xx, a reply that is not an array of as many
        results) raises, failing them all."""
        reply = self.http.request("POST", "", [_body(*item) for item in items])
        if not isinstance(reply, list) or len(reply) != len(items):
            got = f"an array of {len(reply)}" if isinstance(reply, list) else type(reply).__name__
            raise RewardServiceResponseError(
                f"reward service at {self.url}: a batch of {len(items)} needs a JSON array of {len(items)} results "
                f"back (got {got})"
            )
        out: list[tuple[float, dict[str, float]] | RewardServiceError] = []
        for k, result in enumerate(reply):
            if isinstance(result, dict) and "error" in result and "score" not in result:
                message = f"reward service at {self.url} failed item {k} of a batch: {result['error']}"
                out.append(RewardServiceRejectedError(message, 422))
                continue
            try:
                out.append(normalize_result(result, f"reward service at {self.url}, item {k} of a batch"))
            except ValueError as e:
                out.append(RewardServiceResponseError(str(e)))
        return out

    def close(self) -> None:
        self.http.close()
