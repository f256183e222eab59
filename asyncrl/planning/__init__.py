"""The performance model: plan a run before renting the devices (``asyncrl profile``, ``asyncrl plan``).

``cost.json`` is fitted from a finished run (``profile``), and the schedules' own loops run on a virtual clock
(``clock``) through ports that price each phase; ``fully_async`` runs the real ``Producer``. Nothing in a run imports
this package. How it works and how accurate it is: docs/performance.md; its modules: docs/design.md, "The house plan".
"""
