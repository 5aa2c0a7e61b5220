"""Pure builders of everything the operator and the local runner hand to the trainer or the API.

Plan and job in, dicts out; no kubernetes, kopf or torch (import-linter checks it). One policy per module:
`env` (the trainer environment), `nccl` (fabric -> NCCL env), `trainer_config` (job.json), and the object
builders `configmap`, `service`, `pods`, `rbac`, `labels`.
"""
