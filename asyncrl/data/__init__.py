"""Data: verl-schema rows (files and built-in reasoning-gym tasks), tokenised prompts, and the epoch sampler.

Importing this package is cheap: reasoning-gym is imported only when a task is generated.
"""
