"""Role hosting: ``start.start_roles`` starts every role of a run on its backend (Ray actors on placement groups of
``cluster``, or objects in the driver's process, ``backends``), each with its spec; the role workers (trainer,
critic, rollout, reward model); the watchdog that kills a dead driver's processes (``reaper``)."""
