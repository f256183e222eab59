"""Fault supervision: replacing rollout workers that die or hang (``supervisor``: the rollout pool's; fully_async's
Rollouter has its own in ``asyncrl.schedules.fully_async.supervisor``). The watchdog that kills a dead driver's
processes is the cluster's (``asyncrl.workers.reaper``)."""
