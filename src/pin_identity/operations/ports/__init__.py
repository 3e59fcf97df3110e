"""The ports: what the use cases and the jobs need from the outside world, one module per concern (imports,
replica, talent, fanout, outbox, ...); the adapters implement them. Each name is imported from its module.

Where two callers need parts of the same store, the Protocol of what they share declares those methods and
the wider ones extend it: a method is declared once, and its adapter and its fake implement it once.
"""
