"""The ports: what the use cases and the jobs need from the outside world, one module per concern (imports,
replica, talent, fanout, outbox, ...); the adapters implement them. Each name is imported from its module.

Where two callers need parts of the same store, the Protocol of what they share declares those methods and
the wider ones extend it: a method is declared once, and its adapter and its fake implement it once.

What a port returns or takes is defined in its module, so that an adapter imports the port it implements and
nothing else of the operations: plain values a use case sums up (DeadLetters, UserAccessState), and the
documents operators read as a store answers them (RoleView, FailedItem, FanOutTaskView: ApiModels, built by
field name from the statement's columns). The documents the use cases assemble are operations.documents.
"""
