"""The roles of a run as the driver sees them: their typed clients (``clients``), where each runs (``placement``), and
the run's team of roles (``team``), built whole when the workers start (``asyncrl.workers.start``)."""
