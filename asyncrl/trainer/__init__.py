"""The trainer role: its one update loop (``update``), forward passes (``forward``), data-parallel ranks and FSDP2, and
the trainer and critic workers (``actor``, ``critic``)."""
