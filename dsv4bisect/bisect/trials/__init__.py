"""What evaluates one configuration of a bisect: the `Runner` protocol and its runners."""
