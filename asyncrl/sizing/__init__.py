"""What a run will cost before it runs: the memory each role needs per GPU (``memory``), from the model's
``config.json`` alone. (The time model, a run's cost fitted from its timeline, still lives in
``asyncrl.schedules.perf``.) Imports only config, models and torch: the check runs before any worker starts."""
