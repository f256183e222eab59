"""Tools that sit above the product: the benches (``asyncrl bench``: ``bench`` for the schedules, ``bench_ppo`` for
PPO's placements, ``bench_distill`` for distillation, sharing ``bench_common``) and the end-to-end ``demo``
(``make demo``). They only drive the public entry points (``asyncrl.schedules.run_training``, SFT) and read the run
directories those write; nothing in the package imports them but the CLI (``asyncrl.cli``), and they import nothing
from each other but ``bench_common``, except ``bench`` dispatching PPO placements to ``bench_ppo``.
"""
