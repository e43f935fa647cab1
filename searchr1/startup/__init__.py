"""Everything checked before a run starts: config values, option combinations, credentials, the run directory and its lock. Every problem exits with code 2 and one paragraph (``StartupError``)."""
