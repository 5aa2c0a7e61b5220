"""The only code that talks to the Kubernetes API (through the official kubernetes client).

`session` connects; `reads` lists and gets objects as plain camelCase dicts; `writes` creates, deletes and
patches idempotently (AlreadyExists and NotFound are outcomes, not errors); `events` posts Events.
Handlers call these; nothing else in the operator imports `kubernetes`.
"""
