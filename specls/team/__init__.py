"""specls.team: serving one specls to many editors (auth, fair scheduling, metrics, remote engines)."""
