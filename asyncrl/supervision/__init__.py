"""Fault supervision: replacing rollout workers that die or hang (``supervisor``: the rollout pool's; fully_async's
Rollouter has its own in ``asyncrl.schedules.fully_async.supervisor``) and the watchdog that kills a dead driver's
processes (``reaper``)."""
