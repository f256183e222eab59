"""Weight synchronization from the trainer to the rollout workers (docs/performance.md, "Weight sync"): the worker
side in ``endpoints``, the driver side in ``weight_sync``, over a process group of ``asyncrl.comm``'s."""
