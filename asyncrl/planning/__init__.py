"""The performance model: plan a run before renting the devices.

- ``cost``: ``CostModel``, what one finished run costs per unit of work (decode per call, step and token; update per
  token; reward per row; weight sync per byte), each term fitted with its error, saved as ``cost.json``.
- ``profile``: ``asyncrl profile RUN_DIR`` fits it from a run's own records; asyncrl's lab's ``asyncrl probe RUN_DIR``
  adds this machine's thread scaling, prefill price and weight-sync bandwidth (``Scaling``).
- ``clock``: a virtual clock on which processes share a pool of cores or run on devices of their own.
- ``setting``, ``decode``, ``sim_ports``, ``stream``, ``simulate``: the schedules' own loops (``schedules.loops``)
  on that clock, through ports that price each phase; ``fully_async`` runs the real ``Producer`` (the staleness
  controller, queue, ledger and partial-rollout rules) with the engine replaced by the cost model.
- ``plan``: ``asyncrl plan --cost cost.json --gpus N`` searches schedule x split x staleness x sync interval;
  ``commands``: the two commands' parsers. The published setups the model is checked against are in
  ``lab/asyncrl_lab/perf_published.py`` (``asyncrl bench --published``).

A room of its own beside ``schedules``, one floor above it: it runs their code (the loops, the fully_async books) on
its clock, and nothing in a run imports it. The memory side of planning, which a run does check before it starts,
is ``asyncrl.sizing``, below both.
"""
