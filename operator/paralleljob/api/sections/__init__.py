"""The sections of a ParallelJob spec, one module each: its types (the CRD schema) beside its cross-field rules
(CEL for the CRD and their Python twins). `api.types` and `api.rules` gather them.
"""
