"""Will the run fit: the memory each role needs per GPU (``memory``), from the model's ``config.json`` alone, checked
before any worker starts (``check``) and shown as a table (``table``). Its time twin, what a run will cost in seconds,
is the planner (``asyncrl.planning``), which runs the schedules' own loops and so sits above them; this room imports
only config, models and torch, so the config, the model loader and the run can all ask it first."""
