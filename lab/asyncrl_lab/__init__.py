"""What sits beside asyncrl rather than inside it: the benches (``asyncrl bench``: ``bench`` for the schedules,
``bench_ppo`` for PPO's placements, ``bench_distill`` for distillation, ``bench_decode`` and ``bench_engine`` for the
engines, sharing ``bench_common``), the machine probe (``asyncrl probe``: ``probe`` and its ``probe_*`` parts, what a
run's cost model cannot fit from the run's own records), the end-to-end demos (``make demo``, ``make demo-real``,
``make demo-tool``; the real model's task in ``real_task``) and the generator of docs/from-verl.md's key map. They
drive only asyncrl's public entry points (``run_training``, SFT, the engines) and read the run directories those
write. A distribution of its own (lab/pyproject.toml), not in asyncrl's wheel: its commands join ``asyncrl``'s
command line through the ``asyncrl.commands`` entry points (``commands``), and asyncrl imports none of it
(``tests/test_layout.py``).
"""
