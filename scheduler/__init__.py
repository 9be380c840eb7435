"""The policy core: pure functions of state and time that return decisions."""
