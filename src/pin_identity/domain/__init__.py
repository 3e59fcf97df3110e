"""The identity domain: pure values and rules, no I/O."""
