"""Operating the pairs from anywhere that reaches the broker: commands that talk to them
through the state store only."""
