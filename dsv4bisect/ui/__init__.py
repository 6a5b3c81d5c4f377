"""Rich console on stderr: the only module that creates Console objects."""
