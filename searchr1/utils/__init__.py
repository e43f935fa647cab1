"""Small shared utilities: the option registry, lazy imports, secret scrubbing and fault-injection hooks."""
