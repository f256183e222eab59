"""Communication between workers: the one transport decision (``transport``: local, NCCL or gloo, from where the
workers run), process groups that leave torch.distributed's default group alone, with a deadline on every collective
(``groups``), and the in-process ``local`` transport (``local``). The weight sync and the trainer's data-parallel
ranks both build on it; it knows neither."""
