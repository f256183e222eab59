"""Tokenised prompts: rows from ``load_rows`` turned into ``asyncrl.types.Prompt`` objects, once, up front, so an
over-long prompt is found at start-up (with its file and row) and rollout workers only handle token ids; and
``EpochSampler``, the order a run draws them in.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from asyncrl.data.rows import DatasetError, Rows, load_rows, validate_row
from asyncrl.types import Prompt


def tokenize_messages(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    apply_chat_template: bool = True,
    where: str = "prompt",
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids of one prompt, a flat ``list[int]`` whatever the tokenizer returns.

    With ``apply_chat_template`` the tokenizer's chat template is applied with the generation prompt appended (the
    template adds any special tokens). Without it the message contents are joined with newlines and encoded with the
    tokenizer's own special tokens (e.g. BOS), which is what a base model without a chat format expects. ``tools``
    (OpenAI function schemas) go to the template, which renders them if it knows how (the tool agent's tools).
    """
    if apply_chat_template:
        kwargs = {"tools": tools} if tools else {}
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
    else:
        text = "\n".join(m["content"] for m in messages)
        encoded = tokenizer(text, add_special_tokens=True)
    # transformers 5.x returns a ``BatchEncoding`` (a mapping with ``input_ids``) by default, 4.x a plain list; either
    # may be nested one level if the tokenizer treated the input as a batch of one
    if isinstance(encoded, Mapping):
        if "input_ids" not in encoded:
            raise DatasetError(f"{where}: tokenizer returned a mapping without 'input_ids' (keys {list(encoded)})")
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):  # a tensor or array, if a tokenizer insists on one
        encoded = encoded.tolist()
    encoded = list(encoded)
    if encoded and isinstance(encoded[0], list | tuple):
        if len(encoded) != 1:
            raise DatasetError(f"{where}: tokenizer returned a batch of {len(encoded)} sequences for one prompt")
        encoded = list(encoded[0])
    return [int(t) for t in encoded]


OVERLONG_PROMPTS = ("error", "filter", "truncate_left", "truncate_right")


class PromptDataset:
    """Indexable collection of tokenised ``Prompt`` objects.

    ``Prompt.index`` is the row's position in ``rows`` (for one file: its position in the file; for several, in their
    concatenation), so it stays the same across epochs, resumes and filtering. ``len(self)`` counts kept prompts only;
    ``self[i]`` is the i-th *kept* prompt. Each access returns a fresh ``Prompt`` (epoch 0 unless ``get`` is given
    one), so callers may set ``epoch`` without affecting other users.

    ``overlong`` decides what happens to a prompt of more than ``max_prompt_length`` tokens: ``"error"`` raises a
    ``DatasetError`` naming the first such row (and how many there are); ``"filter"`` drops them, counting them in
    ``num_filtered`` and listing their row indices in ``filtered_indices``; ``"truncate_left"`` keeps its last
    ``max_prompt_length`` tokens (verl's ``data.truncation=left``: the end of the prompt, where the question and the
    generation prompt are, survives), ``"truncate_right"`` its first ones; their row indices are in
    ``truncated_indices``.
    """

    def __init__(
        self,
        rows: Sequence[dict[str, Any]],
        tokenizer: Any,
        max_prompt_length: int,
        apply_chat_template: bool = True,
        overlong: Literal["error", "filter", "truncate_left", "truncate_right"] = "error",
        tools: list[dict[str, Any]] | None = None,
    ):
        if overlong not in OVERLONG_PROMPTS:
            raise ValueError(f"PromptDataset: overlong must be one of {', '.join(OVERLONG_PROMPTS)} (got {overlong!r})")
        if max_prompt_length <= 0:
            raise ValueError(f"PromptDataset: max_prompt_length must be positive (got {max_prompt_length})")
        if apply_chat_template and getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"PromptDataset: tokenizer {type(tokenizer).__name__} has no chat_template; "
                "use a tokenizer that has one or set apply_chat_template=False"
            )
        if not isinstance(rows, Rows):
            rows = Rows(rows)
        self.max_prompt_length = max_prompt_length
        self._prompts: list[Prompt] = []
        self.truncated_indices: list[int] = []
        overlong_rows: list[tuple[int, int]] = []  # (row index, length)

        for i, row in enumerate(rows):
            where = rows.where(i)
            row = validate_row(row, where)  # idempotent and cheap; covers rows built in code, not read by load_rows
            ids = tokenize_messages(tokenizer, row["prompt"], apply_chat_template, where, tools)
            if len(ids) > max_prompt_length and overlong.startswith("truncate"):
                self.truncated_indices.append(i)
                ids = ids[-max_prompt_length:] if overlong == "truncate_left" else ids[:max_prompt_length]
            if len(ids) > max_prompt_length:
                overlong_rows.append((i, len(ids)))
                continue
            self._prompts.append(
                Prompt(
                    index=i,
                    prompt_ids=ids,
                    data_source=row["data_source"],
                    ground_truth=str(row["reward_model"]["ground_truth"]),
                    extra_info=dict(row.get("extra_info") or {}),
                    agent_name=row.get("agent_name") or "",
                )
            )

        if overlong_rows and overlong == "error":
            first, length = overlong_rows[0]
            raise DatasetError(
                f"{rows.where(first)}: prompt is {length} tokens, longer than max_prompt_length={max_prompt_length} "
                f"({len(overlong_rows)} of {len(rows)} rows are too long; raise max_prompt_length or filter "
                "overlong prompts)"
            )
        self.filtered_indices: list[int] = [i for i, _ in overlong_rows]
        if len(rows) > 0 and not self._prompts:
            raise DatasetError(
                f"PromptDataset: all {len(rows)} prompts are longer than max_prompt_length={max_prompt_length}"
            )

    @classmethod
    def from_files(
        cls, paths: str | Path | Sequence[str | Path], tokenizer: Any, max_prompt_length: int, **kwargs: Any
    ) -> PromptDataset:
        """``load_rows(paths)`` then tokenise; keyword arguments as for the constructor."""
        return cls(load_rows(paths), tokenizer, max_prompt_length, **kwargs)

    @property
    def num_filtered(self) -> int:
        """How many rows were dropped for being longer than ``max_prompt_length`` (always 0 with ``"error"``)."""
        return len(self.filtered_indices)

    def __len__(self) -> int:
        return len(self._prompts)

    def get(self, i: int, epoch: int = 0) -> Prompt:
        """A fresh copy of the i-th kept prompt, tagged with ``epoch`` (the token list is shared: do not mutate it)."""
        p = self._prompts[i]
        return dataclasses.replace(p, extra_info=dict(p.extra_info), epoch=epoch)

    def __getitem__(self, i: int) -> Prompt:
        if not isinstance(i, int):
            raise TypeError(f"PromptDataset indices must be int (got {type(i).__name__})")
        return self.get(i)

    def max_length(self) -> int:
        """Longest kept prompt, in tokens (0 if empty)."""
        return max((len(p.prompt_ids) for p in self._prompts), default=0)


class EpochSampler:
    """Endless iterator of batches of ``(epoch, index)`` pairs over ``num_items`` dataset positions: one stream, as
    asynchronous training consumes prompts continuously rather than epoch by epoch.

    Every ``(epoch, index)`` pair is yielded exactly once, in order of epoch; epoch ``e`` follows a permutation seeded
    by ``seed + e`` (``0 .. num_items - 1`` with ``shuffle=False``), and a batch may span several epochs. The whole
    state is ``(epoch, position)``, so a resumed run draws exactly the batches the interrupted one would have drawn.
    """

    def __init__(self, num_items: int, batch_size: int, seed: int, shuffle: bool = True):
        if num_items <= 0:
            raise ValueError(f"EpochSampler: num_items must be positive (got {num_items}); is the dataset empty?")
        if batch_size <= 0:
            raise ValueError(f"EpochSampler: batch_size must be positive (got {batch_size})")
        self.num_items = num_items
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0  # of the next index to be drawn
        self.position = 0  # how many indices of the current epoch have been drawn already
        self._order_epoch = -1
        self._order: list[int] = []

    def epoch_order(self, epoch: int) -> list[int]:
        """The order in which epoch ``epoch`` visits the indices (a permutation seeded by ``seed + epoch``)."""
        order = list(range(self.num_items))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def next_batch(self) -> list[tuple[int, int]]:
        """The next ``batch_size`` pairs ``(epoch, index)``, continuing into the next epoch(s) when one runs out."""
        batch: list[tuple[int, int]] = []
        while len(batch) < self.batch_size:
            if self._order_epoch != self.epoch:
                self._order, self._order_epoch = self.epoch_order(self.epoch), self.epoch
            take = min(self.batch_size - len(batch), self.num_items - self.position)
            batch.extend((self.epoch, i) for i in self._order[self.position : self.position + take])
            self.position += take
            if self.position == self.num_items:
                self.epoch += 1
                self.position = 0
        return batch

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        """Yield batches forever (stop by breaking out of the loop)."""
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the stream; the identity fields let ``load_state_dict`` refuse a mismatch."""
        return {k: getattr(self, k) for k in ("epoch", "position", "num_items", "seed", "shuffle")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``. ``batch_size`` may differ from the saved run's; the dataset and order may not."""
        for key in ("num_items", "seed", "shuffle"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"EpochSampler.load_state_dict: saved {key}={state[key]!r} but this sampler has "
                    f"{key}={getattr(self, key)!r}; resuming would visit a different sequence of prompts"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < self.num_items:
            raise ValueError(
                f"EpochSampler.load_state_dict: bad state epoch={epoch} position={position} "
                f"(position must be in [0, {self.num_items}))"
            )
        self.epoch, self.position = epoch, position
