"""Where a bisect's costs come from and the simulated bisect behind `--plan`."""
