"""The search, pure (no I/O, no clock): the hypothesis model, the noise, the design of each
round, the confirmation checks, the posterior search and its pricing."""
