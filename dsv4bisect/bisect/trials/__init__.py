"""What evaluates one configuration of a bisect: the `Runner` protocol and its runners, the hot
runner composed of an engine pool, an ends book and a probing policy."""
