"""`dsv4bisect run`: one configuration judged against its good end, end to end (docs/run.md).

`ends.py` resolves the two configurations and the probe spec, `baseline.py` caches the good
end's probe runs, `arm.py` launches and probes one configuration with the crash semantics,
`session.py` runs the whole loop and writes the run directory.
"""
