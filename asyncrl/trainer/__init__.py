"""The trainer role: its one update loop (``update``), forward passes (``forward``), data-parallel ranks and FSDP2, and
sharded weights gathered (``gathered``); its workers are ``asyncrl.workers.trainer`` and ``asyncrl.workers.critic``."""
