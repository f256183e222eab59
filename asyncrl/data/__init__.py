"""Data: verl-schema rows (files and built-in reasoning-gym tasks), tokenised prompts, and the epoch sampler.

Importing this package is cheap: reasoning-gym is imported only when a task is generated.
"""

from asyncrl.data.dataset import EpochSampler, PromptDataset, tokenize_messages
from asyncrl.data.rows import DatasetError, Rows, load_rows, validate_row, write_rows
from asyncrl.data.tasks import TASKS, TaskSpec, get_task, make_rows, register_task, write_task_dataset

__all__ = [
    "TASKS",
    "DatasetError",
    "EpochSampler",
    "PromptDataset",
    "Rows",
    "TaskSpec",
    "get_task",
    "load_rows",
    "make_rows",
    "register_task",
    "tokenize_messages",
    "validate_row",
    "write_rows",
    "write_task_dataset",
]
